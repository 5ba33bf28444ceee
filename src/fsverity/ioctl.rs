//! fs-verity in the kernel: `FS_IOC_ENABLE_VERITY`, `FS_IOC_MEASURE_VERITY` and
//! `FS_IOC_READ_VERITY_METADATA` (include/uapi/linux/fsverity.h), for `dmkit fsverity enable`,
//! `measure` and `dump-metadata`. The argument structures are encoded byte by byte
//! (little-endian, the x86-64 and aarch64 layout) and every length the kernel returns is
//! checked before it is used.
//!
//! Only on kernels and filesystems with fs-verity (ext4/f2fs/btrfs with the verity feature);
//! elsewhere the ioctls fail with `ENOTTY` or `EOPNOTSUPP`, reported as
//! [`FsVerityError::NotSupported`].

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::descriptor::{hash_algorithm_from_number, hash_algorithm_number};
use super::digest::FsVerityParams;
use super::FsVerityError;

/// `_IOC(dir, 'f', nr, size)` as the kernel's asm-generic/ioctl.h builds it.
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | ((b'f' as u64) << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

/// Size of `struct fsverity_enable_arg`.
const ENABLE_ARG_SIZE: usize = 128;
/// Size of `struct fsverity_digest` without its digest.
const DIGEST_HEADER_SIZE: usize = 4;
/// Size of `struct fsverity_read_metadata_arg`.
const READ_METADATA_ARG_SIZE: usize = 40;
/// Largest digest the kernel returns (`FS_VERITY_MAX_DIGEST_SIZE`, SHA-512).
const MAX_DIGEST_SIZE: usize = 64;

/// `_IOW('f', 133, struct fsverity_enable_arg)`.
const FS_IOC_ENABLE_VERITY: u64 = ioc(IOC_WRITE, 133, ENABLE_ARG_SIZE as u64);
/// `_IOWR('f', 134, struct fsverity_digest)` (the size is of the header alone).
const FS_IOC_MEASURE_VERITY: u64 = ioc(IOC_READ | IOC_WRITE, 134, DIGEST_HEADER_SIZE as u64);
/// `_IOWR('f', 135, struct fsverity_read_metadata_arg)`.
const FS_IOC_READ_VERITY_METADATA: u64 =
    ioc(IOC_READ | IOC_WRITE, 135, READ_METADATA_ARG_SIZE as u64);

/// An ioctl argument buffer, 8-byte aligned like the C structures.
#[repr(C, align(8))]
struct Arg<const N: usize>([u8; N]);

impl<const N: usize> Arg<N> {
    fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// The symbolic name of an errno fs-verity's ioctls return (`errno N` for others).
fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::ENOTTY => "ENOTTY",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EEXIST => "EEXIST",
        libc::ETXTBSY => "ETXTBSY",
        libc::EBADMSG => "EBADMSG",
        libc::EKEYREJECTED => "EKEYREJECTED",
        libc::ENOKEY => "ENOKEY",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::EROFS => "EROFS",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EINVAL => "EINVAL",
        libc::ENOPKG => "ENOPKG",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EDQUOT => "EDQUOT",
        libc::EINTR => "EINTR",
        libc::ENODATA => "ENODATA",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EISDIR => "EISDIR",
        libc::ENOMEM => "ENOMEM",
        libc::EIO => "EIO",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

/// Opens `path` read-only (fs-verity is enabled through a read-only descriptor; the kernel
/// refuses files open for writing) and checks that it is a regular file.
fn open_regular(path: &Path) -> Result<File, FsVerityError> {
    let io = |e: std::io::Error| FsVerityError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let file = File::open(path).map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(FsVerityError::NotRegularFile(path.to_path_buf()));
    }
    Ok(file)
}

/// Runs an fs-verity ioctl on `file` with `arg`; returns its non-negative result or the errno.
fn ioctl(file: &File, request: u64, arg: *mut u8) -> Result<i32, i32> {
    // SAFETY: `arg` points to a live buffer of the size encoded in `request`, whose embedded
    // pointers (salt, signature, output buffer) point to live buffers of the lengths written
    // beside them; the kernel reads and writes only within those.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), request as _, arg) };
    if r < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(r)
    }
}

/// The error for a failed ioctl: "not supported" for `ENOTTY`/`EOPNOTSUPP`, else `action`
/// failed for the reason `explain` gives the errno (or the system's text for it).
fn kernel_error(
    path: &Path,
    action: &'static str,
    errno: i32,
    explain: impl Fn(i32) -> Option<&'static str>,
) -> FsVerityError {
    if errno == libc::ENOTTY || errno == libc::EOPNOTSUPP {
        return FsVerityError::NotSupported {
            path: path.to_path_buf(),
            feature: "fs-verity",
            errno: if errno == libc::ENOTTY {
                "ENOTTY"
            } else {
                "EOPNOTSUPP"
            },
        };
    }
    let text = match explain(errno) {
        Some(t) => t.to_string(),
        None => std::io::Error::from_raw_os_error(errno).to_string(),
    };
    FsVerityError::Kernel {
        path: path.to_path_buf(),
        action,
        reason: format!("{text} ({})", errno_name(errno)),
    }
}

/// Enables fs-verity on `path` with the Merkle tree `params` and, if given, a built-in
/// signature (DER PKCS#7, as [`super::sign_digest`] makes) for the kernel to check against its
/// `.fs-verity` keyring — what `fsverity enable` does. The file becomes read-only for good.
pub fn enable(
    path: &Path,
    params: &FsVerityParams,
    signature: Option<&[u8]>,
) -> Result<(), FsVerityError> {
    params.validate()?;
    let file = open_regular(path)?;
    let alg = hash_algorithm_number(params.hash)
        .ok_or_else(|| FsVerityError::UnsupportedHash(params.hash.name().to_string()))?;
    let sig = signature.unwrap_or(&[]);
    let sig_size = u32::try_from(sig.len()).map_err(|_| FsVerityError::Kernel {
        path: path.to_path_buf(),
        action: "cannot enable fs-verity",
        reason: format!("signature of {} bytes is too large", sig.len()),
    })?;
    // struct fsverity_enable_arg: version, hash_algorithm, block_size, salt_size (le32 each),
    // salt_ptr (le64), sig_size, reserved (le32), sig_ptr (le64), 11 reserved le64.
    let mut arg = Arg::<ENABLE_ARG_SIZE>([0; ENABLE_ARG_SIZE]);
    arg.put_u32(0, 1);
    arg.put_u32(4, alg as u32);
    arg.put_u32(8, params.block_size);
    arg.put_u32(12, params.salt.len() as u32);
    if !params.salt.is_empty() {
        arg.put_u64(16, params.salt.as_ptr() as u64);
    }
    arg.put_u32(24, sig_size);
    if !sig.is_empty() {
        arg.put_u64(32, sig.as_ptr() as u64);
    }
    let signed = !sig.is_empty();
    ioctl(&file, FS_IOC_ENABLE_VERITY, arg.0.as_mut_ptr())
        .map(|_| ())
        .map_err(|errno| {
            if signed && errno == libc::EOPNOTSUPP {
                // Also what a kernel without built-in signature support says.
                return FsVerityError::NotSupported {
                    path: path.to_path_buf(),
                    feature: "fs-verity or its built-in signatures",
                    errno: "EOPNOTSUPP",
                };
            }
            kernel_error(path, "cannot enable fs-verity", errno, |e| {
                Some(match e {
                    libc::EEXIST => "fs-verity is already enabled on this file",
                    libc::ETXTBSY => "the file is open for writing",
                    libc::EBADMSG => "the kernel cannot parse the signature",
                    libc::EKEYREJECTED => {
                        "the kernel rejected the signature (not over this file's digest with these parameters, or not by the key it names)"
                    }
                    libc::ENOKEY => "the signer's certificate is not in the kernel's .fs-verity keyring",
                    libc::EPERM if !signed => {
                        "the kernel requires a signature (fs.verity.require_signatures = 1)"
                    }
                    libc::EACCES => "permission denied (enabling needs write access to the file)",
                    libc::EROFS => "the filesystem is read-only",
                    libc::EMSGSIZE => "the signature is larger than the kernel takes",
                    libc::EINVAL => {
                        "the kernel or filesystem refused the parameters (block size, hash algorithm or salt)"
                    }
                    libc::ENOPKG => "the kernel lacks the hash algorithm",
                    libc::EFBIG => "the file is too large for a Merkle tree with this block size",
                    libc::ENOSPC | libc::EDQUOT => "no space left for the Merkle tree",
                    _ => return None,
                })
            })
        })
}

/// A digest the kernel measured: fs-verity's algorithm number and the digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurement {
    /// `FS_VERITY_HASH_ALG_*` (1 SHA-256, 2 SHA-512).
    pub algorithm: u16,
    /// The file's fs-verity digest.
    pub digest: Vec<u8>,
}

/// `sha256:<hex>` as `fsverity measure` prints it; `ALG_<n>:<hex>` for an algorithm it does
/// not know.
impl std::fmt::Display for Measurement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hash = u8::try_from(self.algorithm)
            .ok()
            .and_then(hash_algorithm_from_number);
        match hash {
            Some(h) => write!(f, "{}:", h.name())?,
            None => write!(f, "ALG_{}:", self.algorithm)?,
        }
        write!(f, "{}", hex::encode(&self.digest))
    }
}

/// The fs-verity digest of a verity file as the kernel reports it (`FS_IOC_MEASURE_VERITY`):
/// what `fsverity measure` prints.
pub fn measure(path: &Path) -> Result<Measurement, FsVerityError> {
    let file = open_regular(path)?;
    // struct fsverity_digest: le16 digest_algorithm, le16 digest_size (in: room; out: size),
    // then the digest.
    let mut arg = Arg::<{ DIGEST_HEADER_SIZE + MAX_DIGEST_SIZE }>([0; 68]);
    arg.0[2..4].copy_from_slice(&(MAX_DIGEST_SIZE as u16).to_le_bytes());
    ioctl(&file, FS_IOC_MEASURE_VERITY, arg.0.as_mut_ptr()).map_err(|errno| {
        kernel_error(path, "cannot measure", errno, |e| match e {
            libc::ENODATA => Some("fs-verity is not enabled on this file"),
            libc::EOVERFLOW => Some("the kernel's digest is larger than 64 bytes"),
            _ => None,
        })
    })?;
    let algorithm = u16::from_le_bytes([arg.0[0], arg.0[1]]);
    let size = u16::from_le_bytes([arg.0[2], arg.0[3]]) as usize;
    if size > MAX_DIGEST_SIZE {
        return Err(FsVerityError::Kernel {
            path: path.to_path_buf(),
            action: "cannot measure",
            reason: format!("the kernel returned a digest size of {size} bytes, more than the {MAX_DIGEST_SIZE} it was given"),
        });
    }
    Ok(Measurement {
        algorithm,
        digest: arg.0[DIGEST_HEADER_SIZE..DIGEST_HEADER_SIZE + size].to_vec(),
    })
}

/// What `FS_IOC_READ_VERITY_METADATA` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataType {
    /// The Merkle tree blocks, top level first, as the filesystem stores them.
    MerkleTree,
    /// The `struct fsverity_descriptor` (with the kernel's in-memory signature size field).
    Descriptor,
    /// The built-in signature given at enable time (`ENODATA` if none).
    Signature,
}

impl MetadataType {
    /// fsverity-utils' name (`merkle_tree`, `descriptor`, `signature`).
    pub fn name(self) -> &'static str {
        match self {
            MetadataType::MerkleTree => "merkle_tree",
            MetadataType::Descriptor => "descriptor",
            MetadataType::Signature => "signature",
        }
    }

    /// The type named `name` (fsverity-utils' names).
    pub fn from_name(name: &str) -> Option<Self> {
        [
            MetadataType::MerkleTree,
            MetadataType::Descriptor,
            MetadataType::Signature,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    fn number(self) -> u64 {
        match self {
            MetadataType::MerkleTree => 1,
            MetadataType::Descriptor => 2,
            MetadataType::Signature => 3,
        }
    }
}

/// A verity file opened for [`MetadataReader::read_at`].
pub struct MetadataReader {
    file: File,
    path: std::path::PathBuf,
}

impl MetadataReader {
    /// Opens `path` (a regular file) for reading its fs-verity metadata.
    pub fn open(path: &Path) -> Result<Self, FsVerityError> {
        Ok(MetadataReader {
            file: open_regular(path)?,
            path: path.to_path_buf(),
        })
    }

    /// Reads `kind` metadata at `offset` into `buf`; returns how many bytes were read (0 at
    /// the end).
    pub fn read_at(
        &self,
        kind: MetadataType,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, FsVerityError> {
        // struct fsverity_read_metadata_arg: metadata_type, offset, length, buf_ptr, reserved
        // (le64 each).
        let mut arg = Arg::<READ_METADATA_ARG_SIZE>([0; READ_METADATA_ARG_SIZE]);
        arg.put_u64(0, kind.number());
        arg.put_u64(8, offset);
        arg.put_u64(16, buf.len() as u64);
        arg.put_u64(24, buf.as_mut_ptr() as u64);
        let n = ioctl(&self.file, FS_IOC_READ_VERITY_METADATA, arg.0.as_mut_ptr()).map_err(
            |errno| {
                kernel_error(
                    &self.path,
                    "cannot read fs-verity metadata",
                    errno,
                    |e| match e {
                        libc::ENODATA if kind == MetadataType::Signature => {
                            Some("the file is not a verity file, or has no built-in signature")
                        }
                        libc::ENODATA => Some("fs-verity is not enabled on this file"),
                        _ => None,
                    },
                )
            },
        )?;
        let n = n as usize;
        if n > buf.len() {
            return Err(FsVerityError::Kernel {
                path: self.path.clone(),
                action: "cannot read fs-verity metadata",
                reason: format!(
                    "the kernel returned {n} bytes for a {}-byte buffer",
                    buf.len()
                ),
            });
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_are_the_kernels() {
        // From include/uapi/linux/fsverity.h, as the C preprocessor computes them.
        assert_eq!(FS_IOC_ENABLE_VERITY, 0x4080_6685);
        assert_eq!(FS_IOC_MEASURE_VERITY, 0xc004_6686);
        assert_eq!(FS_IOC_READ_VERITY_METADATA, 0xc028_6687);
    }

    #[test]
    fn measurement_prints_like_fsverity_measure() {
        let m = Measurement {
            algorithm: 1,
            digest: vec![0xab; 32],
        };
        assert_eq!(m.to_string(), format!("sha256:{}", "ab".repeat(32)));
        let m = Measurement {
            algorithm: 9,
            digest: vec![1, 2],
        };
        assert_eq!(m.to_string(), "ALG_9:0102");
    }

    #[test]
    fn metadata_names() {
        for t in [
            MetadataType::MerkleTree,
            MetadataType::Descriptor,
            MetadataType::Signature,
        ] {
            assert_eq!(MetadataType::from_name(t.name()), Some(t));
        }
        assert_eq!(MetadataType::from_name("tree"), None);
    }
}
