//! dm-crypt's authenticated sector modes (LUKS2 `--integrity`): one encryption sector sealed
//! with its per-sector metadata, the bytes dm-integrity stores beside it.
//!
//! What the kernel does (`crypt_convert_block_aead`, and `crypt_convert_block_skcipher` for
//! `integrity:N:none`):
//!
//! - the metadata of a sector is the authentication tag, then the IV when the IV mode is
//!   `random` (fresh random bytes for every write), zero padded to dm-integrity's tag size;
//! - the additional data is le64(sector) || IV, where the sector counts 512-byte sectors from
//!   the start of the segment even with 4 KiB encryption sectors (LUKS2 does not set
//!   `iv_large_sectors`), and a `plain64` IV is that same sector number, little endian, zero
//!   padded;
//! - `authenc(hmac(H),xts(aes))` encrypts with XTS, then takes HMAC-H over the additional data
//!   and the ciphertext (encrypt-then-MAC); its volume key is the XTS key followed by the HMAC
//!   key;
//! - `gcm(aes)` and `rfc7539(chacha20,poly1305)` are the standard AEADs with a 12-byte IV.
//!
//! A sector whose tag does not verify is never decrypted into the caller's buffer.

use super::dispatch::new_sector_cipher;
use super::sector::SectorCipher;
use super::spec::CipherSpec;
use openssl::memcmp;
use openssl::symm::{Cipher, Crypter, Mode};
use zeroize::Zeroizing;

/// How the sectors of a LUKS2 segment with integrity are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AeadKind {
    /// `capi:authenc(hmac(sha256|sha512),xts(aes))-plain64|random`.
    AuthencXts {
        /// The HMAC's hash: SHA-256 (tags of 32 bytes) or SHA-512 (64).
        sha512: bool,
        /// The IV is random and stored in the metadata (else `plain64`).
        random_iv: bool,
    },
    /// `capi:gcm(aes)-random`: AES-GCM, 16-byte tag, 12-byte random IV.
    AesGcm,
    /// `capi:rfc7539(chacha20,poly1305)-random`: 16-byte tag, 12-byte random IV.
    ChaCha20Poly1305,
    /// `capi:xts(aes)-random` with `integrity:16:none`: no authentication, the random IV alone
    /// is stored.
    XtsRandom,
}

/// Why a LUKS2 cipher and integrity pair cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AeadError {
    /// The pair is not one the kernel supports with LUKS2.
    #[error("cipher {cipher} with integrity {integrity} is not supported")]
    Unsupported {
        /// The cipher (`aes-xts-plain64`).
        cipher: String,
        /// The integrity (`hmac(sha256)`, `aead`, `poly1305`, `none`).
        integrity: String,
    },
    /// The volume key has the wrong size for the pair.
    #[error("a {kind} volume key has {want} bytes, not {got}")]
    KeySize {
        /// The mode.
        kind: &'static str,
        /// The size it needs.
        want: String,
        /// The size given.
        got: usize,
    },
    /// A sector's tag does not verify.
    #[error("authentication failed")]
    Auth,
    /// The sector or metadata buffer has the wrong size (a caller's mistake).
    #[error("{0}")]
    Buffer(String),
}

impl AeadKind {
    /// The mode of a LUKS2 segment's `cipher` and `integrity` fields (`integrity.type`, as
    /// `luksDump` prints it: `hmac(sha256)`, `aead`, `poly1305`, `none`).
    pub fn from_luks2(cipher: &str, integrity: &str) -> Result<AeadKind, AeadError> {
        let unsupported = || AeadError::Unsupported {
            cipher: cipher.into(),
            integrity: integrity.into(),
        };
        Ok(match (cipher, integrity) {
            ("aes-xts-plain64", "hmac(sha256)") => AeadKind::AuthencXts {
                sha512: false,
                random_iv: false,
            },
            ("aes-xts-plain64", "hmac(sha512)") => AeadKind::AuthencXts {
                sha512: true,
                random_iv: false,
            },
            ("aes-xts-random", "hmac(sha256)") => AeadKind::AuthencXts {
                sha512: false,
                random_iv: true,
            },
            ("aes-xts-random", "hmac(sha512)") => AeadKind::AuthencXts {
                sha512: true,
                random_iv: true,
            },
            ("aes-gcm-random", "aead") => AeadKind::AesGcm,
            ("chacha20-random", "poly1305") => AeadKind::ChaCha20Poly1305,
            ("aes-xts-random", "none") => AeadKind::XtsRandom,
            _ => return Err(unsupported()),
        })
    }

    /// Bytes of the authentication tag.
    pub fn auth_size(self) -> usize {
        match self {
            AeadKind::AuthencXts { sha512: false, .. } => 32,
            AeadKind::AuthencXts { sha512: true, .. } => 64,
            AeadKind::AesGcm | AeadKind::ChaCha20Poly1305 => 16,
            AeadKind::XtsRandom => 0,
        }
    }

    /// Bytes of the IV (stored in the metadata when random).
    pub fn iv_size(self) -> usize {
        match self {
            AeadKind::AuthencXts { .. } | AeadKind::XtsRandom => 16,
            AeadKind::AesGcm | AeadKind::ChaCha20Poly1305 => 12,
        }
    }

    /// Whether the IV is random and stored after the tag.
    pub fn stores_iv(self) -> bool {
        !matches!(
            self,
            AeadKind::AuthencXts {
                random_iv: false,
                ..
            }
        )
    }

    /// Metadata bytes per sector: dm-integrity's tag size for this mode.
    pub fn metadata_size(self) -> usize {
        self.auth_size() + if self.stores_iv() { self.iv_size() } else { 0 }
    }

    /// The volume key sizes this mode takes.
    fn key_sizes(self) -> &'static [usize] {
        match self {
            // XTS-AES-128 or -256, then the HMAC key (as long as the hash's output).
            AeadKind::AuthencXts { sha512: false, .. } => &[64, 96],
            AeadKind::AuthencXts { sha512: true, .. } => &[96, 128],
            AeadKind::AesGcm => &[16, 24, 32],
            AeadKind::ChaCha20Poly1305 => &[32],
            AeadKind::XtsRandom => &[32, 64],
        }
    }

    fn name(self) -> &'static str {
        match self {
            AeadKind::AuthencXts { sha512: false, .. } => "authenc(hmac(sha256),xts(aes))",
            AeadKind::AuthencXts { sha512: true, .. } => "authenc(hmac(sha512),xts(aes))",
            AeadKind::AesGcm => "gcm(aes)",
            AeadKind::ChaCha20Poly1305 => "rfc7539(chacha20,poly1305)",
            AeadKind::XtsRandom => "xts(aes)",
        }
    }
}

/// Seals and opens the sectors of one segment.
pub struct SectorAead {
    kind: AeadKind,
    /// The encryption key (XTS: both halves).
    enc_key: Zeroizing<Vec<u8>>,
    sector_size: usize,
    /// `authenc(hmac(sha256),xts(aes))-plain64`, the documents' configuration, on the fast
    /// primitives: XTS on the crypt target's sector cipher (VAES where the CPU has it), HMAC
    /// multi-buffer over a batch of sectors.
    fast: Option<FastAuthenc>,
    /// `authenc(hmac(sha256),...)`: the MAC key's pad states, compressed once here (every
    /// tag then costs its own blocks plus one outer compression).
    mac256: Option<crate::hash::HmacSha256State>,
    /// `authenc(hmac(sha512),...)`: likewise.
    mac512: Option<crate::hash::HmacSha512State>,
}

/// The primitives of the fast `authenc(hmac(sha256),xts(aes))-plain64` path.
struct FastAuthenc {
    xts: Box<dyn SectorCipher>,
}

/// Bytes of the per-sector HMAC prefix: le64(sector) || IV.
const AAD_LEN: usize = 8 + 16;

/// Sectors the fast path takes at a time (32 KiB of 512-byte sectors): their MACs and
/// prefixes sit on the stack, and the group is decrypted or MACed while its bytes are still
/// in the CPU's cache.
const FAST_GROUP: usize = 64;

/// Whether two 32-byte MACs are equal, in time independent of where they differ: OR of the
/// XORs of their words (a libcrypto `CRYPTO_memcmp` call per 512-byte sector cost about 6% of
/// a 1 MiB read).
fn macs_equal(a: &[u8], b: &[u8]) -> bool {
    assert_eq!(a.len(), b.len());
    let mut diff = 0u64;
    for (x, y) in a.chunks(8).zip(b.chunks(8)) {
        let mut w = [0u8; 8];
        let mut v = [0u8; 8];
        w[..x.len()].copy_from_slice(x);
        v[..y.len()].copy_from_slice(y);
        diff |= u64::from_ne_bytes(w) ^ u64::from_ne_bytes(v);
    }
    std::hint::black_box(diff) == 0
}

/// Smallest part of a batch worth a thread of its own: starting one costs some tens of
/// microseconds, sealing 256 KiB a hundred or more.
const PARALLEL_MIN: usize = 256 << 10;

impl std::fmt::Debug for SectorAead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SectorAead")
            .field("kind", &self.kind)
            .field("sector_size", &self.sector_size)
            .finish_non_exhaustive()
    }
}

impl SectorAead {
    /// A sealer for `kind` with `volume_key` over encryption sectors of `sector_size` bytes.
    pub fn new(
        kind: AeadKind,
        volume_key: &[u8],
        sector_size: usize,
    ) -> Result<SectorAead, AeadError> {
        if !kind.key_sizes().contains(&volume_key.len()) {
            return Err(AeadError::KeySize {
                kind: kind.name(),
                want: format!("{:?}", kind.key_sizes()),
                got: volume_key.len(),
            });
        }
        if !sector_size.is_power_of_two() || !(512..=4096).contains(&sector_size) {
            return Err(AeadError::Buffer(format!(
                "sector size {sector_size} is not a power of two in 512..4096"
            )));
        }
        let mac_len = match kind {
            AeadKind::AuthencXts { .. } => kind.auth_size(),
            _ => 0,
        };
        let split = volume_key.len() - mac_len;
        let (enc_key, mac_key) = volume_key.split_at(split);
        let fast = match kind {
            AeadKind::AuthencXts {
                sha512: false,
                random_iv: false,
            } => {
                let spec = CipherSpec::parse("aes-xts-plain64")
                    .map_err(|e| AeadError::Buffer(e.to_string()))?;
                let xts = new_sector_cipher(&spec, enc_key)
                    .map_err(|e| AeadError::Buffer(e.to_string()))?;
                Some(FastAuthenc { xts })
            }
            _ => None,
        };
        let mac256 = matches!(kind, AeadKind::AuthencXts { sha512: false, .. })
            .then(|| crate::hash::HmacSha256State::new(mac_key));
        let mac512 = matches!(kind, AeadKind::AuthencXts { sha512: true, .. })
            .then(|| crate::hash::HmacSha512State::new(mac_key));
        Ok(SectorAead {
            kind,
            enc_key: Zeroizing::new(enc_key.to_vec()),
            sector_size,
            fast,
            mac256,
            mac512,
        })
    }

    /// The mode.
    pub fn kind(&self) -> AeadKind {
        self.kind
    }

    /// The encryption sector size.
    pub fn sector_size(&self) -> usize {
        self.sector_size
    }

    /// Check a batch: whole sectors, and `stride` bytes of metadata (at least the mode's) for
    /// each.
    fn check_batch(&self, data: &[u8], meta: &[u8], stride: usize) -> Result<usize, AeadError> {
        let ss = self.sector_size;
        let n = data.len() / ss;
        if !data.len().is_multiple_of(ss)
            || stride < self.kind.metadata_size()
            || meta.len() != n * stride
        {
            return Err(AeadError::Buffer(format!(
                "{} bytes of sectors of {ss} with {} metadata bytes of stride {stride}",
                data.len(),
                meta.len()
            )));
        }
        Ok(n)
    }

    /// The HMAC-SHA-256 tags of the ciphertext sectors `data` (at most [`FAST_GROUP`]), the
    /// first at 512-byte sector `first` (plain64 IVs), into `macs` (32 bytes each).
    fn fast_macs(&self, first: u64, data: &[u8], macs: &mut [u8]) {
        let ss = self.sector_size;
        let n = data.len() / ss;
        debug_assert!(n <= FAST_GROUP);
        let step = (ss / 512) as u64;
        let mut prefixes = [0u8; FAST_GROUP * AAD_LEN];
        let prefixes = &mut prefixes[..n * AAD_LEN];
        for (i, p) in prefixes.chunks_exact_mut(AAD_LEN).enumerate() {
            let sector = (first + i as u64 * step).to_le_bytes();
            p[..8].copy_from_slice(&sector);
            p[8..16].copy_from_slice(&sector);
        }
        let Some(key) = &self.mac256 else {
            unreachable!("the fast path is authenc(hmac(sha256))")
        };
        crate::hash::hmac_sha256_prefixed_blocks(key, prefixes, AAD_LEN, data, ss, macs);
    }

    /// The fast path's groups of [`FAST_GROUP`] sectors of `data`, each with its item of
    /// `metas` (its metadata) and its first 512-byte sector (`first` for the first group).
    fn groups<'d, M>(
        &self,
        first: u64,
        data: &'d mut [u8],
        metas: impl Iterator<Item = M>,
    ) -> impl Iterator<Item = (u64, &'d mut [u8], M)> {
        let ss = self.sector_size;
        let step = (ss / 512) as u64;
        data.chunks_mut(FAST_GROUP * ss)
            .zip(metas)
            .enumerate()
            .map(move |(g, (d, m))| (first + (g * FAST_GROUP) as u64 * step, d, m))
    }

    /// XTS over whole sectors with plain64 IVs of 512-byte sectors (`first`, then
    /// `first + sector_size / 512`, ...).
    fn fast_xts(f: &FastAuthenc, ss: usize, first: u64, data: &mut [u8], decrypt: bool) {
        let step = (ss / 512) as u64;
        let run = |b: &mut [u8], iv: u64| {
            if decrypt {
                f.xts.decrypt(b, iv, ss)
            } else {
                f.xts.encrypt(b, iv, ss)
            }
        };
        if step == 1 {
            run(data, first);
        } else {
            for (i, s) in data.chunks_exact_mut(ss).enumerate() {
                run(s, first + i as u64 * step);
            }
        }
    }

    /// Seal whole sectors: encrypt `data` in place (the first sector at 512-byte `first`, the
    /// next at `first + sector_size / 512`, ...) and write each sector's metadata to its
    /// `stride`-byte slot of `meta` (zero padded), with fresh random IVs where the mode stores
    /// them.
    pub fn seal_sectors(
        &self,
        first: u64,
        data: &mut [u8],
        meta: &mut [u8],
        stride: usize,
    ) -> Result<(), AeadError> {
        let ss = self.sector_size;
        let n = self.check_batch(data, meta, stride)?;
        if let Some(f) = &self.fast {
            // A group at a time, its MACs taken while its ciphertext is still in the cache.
            let mut macs = [0u8; FAST_GROUP * 32];
            for (at, d, m) in self.groups(first, data, meta.chunks_mut(FAST_GROUP * stride)) {
                let macs = &mut macs[..d.len() / ss * 32];
                Self::fast_xts(f, ss, at, d, false);
                self.fast_macs(at, d, macs);
                Self::put_macs(m, macs, stride);
            }
            return Ok(());
        }
        let iv_len = self.kind.iv_size();
        let mut ivs = Zeroizing::new(vec![0u8; n * iv_len]);
        if self.kind.stores_iv() {
            getrandom::getrandom(&mut ivs)
                .map_err(|e| AeadError::Buffer(format!("random IVs: {e}")))?;
        }
        let step = (ss / 512) as u64;
        for (i, ((d, m), iv)) in data
            .chunks_exact_mut(ss)
            .zip(meta.chunks_exact_mut(stride))
            .zip(ivs.chunks_exact(iv_len))
            .enumerate()
        {
            self.seal(first + i as u64 * step, d, m, iv)?;
        }
        Ok(())
    }

    /// Whether sealing whole sectors into buffers of the right sizes cannot fail: the fast
    /// `authenc(hmac(sha256),xts(aes))-plain64` path draws no random IVs and calls no library
    /// that can refuse. A caller may then seal straight into memory a device has lent it.
    pub fn seal_cannot_fail(&self) -> bool {
        self.fast.is_some()
    }

    /// [`seal_sectors`](SectorAead::seal_sectors) of the plaintext `src` into `data` (the
    /// same length), which ends holding the ciphertext: the fast path encrypts from one buffer
    /// into the other a group at a time, so the plaintext is never copied first.
    pub fn seal_sectors_from(
        &self,
        first: u64,
        src: &[u8],
        data: &mut [u8],
        meta: &mut [u8],
        stride: usize,
    ) -> Result<(), AeadError> {
        if src.len() != data.len() {
            return Err(AeadError::Buffer(format!(
                "{} bytes of plaintext for {} bytes of sectors",
                src.len(),
                data.len()
            )));
        }
        let Some(f) = &self.fast else {
            data.copy_from_slice(src);
            return self.seal_sectors(first, data, meta, stride);
        };
        let ss = self.sector_size;
        self.check_batch(data, meta, stride)?;
        let step = (ss / 512) as u64;
        let mut macs = [0u8; FAST_GROUP * 32];
        let groups = self.groups(first, data, meta.chunks_mut(FAST_GROUP * stride));
        for ((at, d, m), s) in groups.zip(src.chunks(FAST_GROUP * ss)) {
            let macs = &mut macs[..d.len() / ss * 32];
            if step == 1 {
                f.xts.encrypt_to(s, d, at, ss);
            } else {
                let sectors = s.chunks_exact(ss).zip(d.chunks_exact_mut(ss));
                for (i, (s, d)) in sectors.enumerate() {
                    f.xts.encrypt_to(s, d, at + i as u64 * step, ss);
                }
            }
            self.fast_macs(at, d, macs);
            Self::put_macs(m, macs, stride);
        }
        Ok(())
    }

    /// Each 32-byte MAC of `macs` into its `stride`-byte slot of `meta`, zero padded.
    fn put_macs(meta: &mut [u8], macs: &[u8], stride: usize) {
        for (m, mac) in meta.chunks_exact_mut(stride).zip(macs.chunks_exact(32)) {
            m[..32].copy_from_slice(mac);
            m[32..].fill(0);
        }
    }

    /// How many threads a batch of `bytes` is split over: one per core, each with at least
    /// `PARALLEL_MIN` (256 KiB), so that a large request is not bound by one core while a small
    /// one pays no thread start. Callers that fetch or store the sectors themselves split
    /// their own work the same way (the crypt target reads and opens each part on its core).
    pub fn parallel_parts(&self, bytes: usize) -> usize {
        if bytes < 2 * PARALLEL_MIN {
            return 1;
        }
        // Asked once: available_parallelism reads the cgroup's CPU quota from /sys.
        static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        (bytes / PARALLEL_MIN).clamp(1, cores)
    }

    /// [`seal_sectors`](SectorAead::seal_sectors) split over the cores when the batch is large
    /// (scoped threads on contiguous parts: no queue, the caller waits for all of them).
    pub fn seal_sectors_parallel(
        &self,
        first: u64,
        data: &mut [u8],
        meta: &mut [u8],
        stride: usize,
    ) -> Result<(), AeadError> {
        let ss = self.sector_size;
        let n = self.check_batch(data, meta, stride)?;
        let parts = self.parallel_parts(data.len());
        if parts == 1 {
            return self.seal_sectors(first, data, meta, stride);
        }
        let per = n.div_ceil(parts);
        let parts = data.chunks_mut(per * ss).zip(meta.chunks_mut(per * stride));
        in_parts(ss, first, per, parts, &|at, d, m| {
            self.seal_sectors(at, d, m, stride)
        })
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .map(|_| ())
    }

    /// [`open_sectors`](SectorAead::open_sectors) split over the cores when the batch is large;
    /// when any sector fails, the whole of `data` is zeroed.
    pub fn open_sectors_parallel(
        &self,
        first: u64,
        data: &mut [u8],
        meta: &[u8],
        stride: usize,
    ) -> Result<Vec<u64>, AeadError> {
        let ss = self.sector_size;
        let n = self.check_batch(data, meta, stride)?;
        let parts = self.parallel_parts(data.len());
        if parts == 1 {
            return self.open_sectors(first, data, meta, stride);
        }
        let per = n.div_ceil(parts);
        let parts = data.chunks_mut(per * ss).zip(meta.chunks(per * stride));
        let results = in_parts(ss, first, per, parts, &|at, d, m| {
            self.open_sectors(at, d, m, stride)
        });
        let mut bad = Vec::new();
        for r in results {
            bad.extend(r?);
        }
        if !bad.is_empty() {
            data.fill(0);
        }
        Ok(bad)
    }

    /// Verify whole sectors against their metadata (`stride` bytes each) and decrypt them in
    /// place. Returns the 512-byte sector numbers of the sectors that fail; when any does,
    /// `data` is zeroed: nothing unauthenticated reaches the caller.
    pub fn open_sectors(
        &self,
        first: u64,
        data: &mut [u8],
        meta: &[u8],
        stride: usize,
    ) -> Result<Vec<u64>, AeadError> {
        let ss = self.sector_size;
        self.check_batch(data, meta, stride)?;
        let step = (ss / 512) as u64;
        let mut bad = Vec::new();
        if let Some(f) = &self.fast {
            // A group at a time: its MACs, then, when they all verify, its decryption while the
            // ciphertext is still in the cache. A group with a bad sector stays encrypted, and
            // the whole batch is zeroed below: nothing unauthenticated is returned.
            let mut macs = [0u8; FAST_GROUP * 32];
            for (at, d, m) in self.groups(first, data, meta.chunks(FAST_GROUP * stride)) {
                let macs = &mut macs[..d.len() / ss * 32];
                self.fast_macs(at, d, macs);
                for (i, (m, mac)) in m
                    .chunks_exact(stride)
                    .zip(macs.chunks_exact(32))
                    .enumerate()
                {
                    if !macs_equal(&m[..32], mac) {
                        bad.push(at + i as u64 * step);
                    }
                }
                if bad.is_empty() {
                    Self::fast_xts(f, ss, at, d, true);
                }
            }
        } else {
            for (i, (d, m)) in data
                .chunks_exact_mut(ss)
                .zip(meta.chunks_exact(stride))
                .enumerate()
            {
                let sector = first + i as u64 * step;
                match self.open(sector, d, m) {
                    Ok(()) => {}
                    Err(AeadError::Auth) => bad.push(sector),
                    Err(e) => return Err(e),
                }
            }
        }
        if !bad.is_empty() {
            data.fill(0);
        }
        Ok(bad)
    }

    /// The IV of a sector: `random` takes `stored` (the bytes after the tag), `plain64` the
    /// 512-byte sector number.
    fn iv(&self, sector: u64, stored: &[u8]) -> Zeroizing<Vec<u8>> {
        let n = self.kind.iv_size();
        let mut iv = Zeroizing::new(vec![0u8; n]);
        if self.kind.stores_iv() {
            iv.copy_from_slice(&stored[..n]);
        } else {
            iv[..8].copy_from_slice(&sector.to_le_bytes());
        }
        iv
    }

    fn check(&self, data: &[u8], meta: &[u8]) -> Result<(), AeadError> {
        if data.len() != self.sector_size || meta.len() < self.kind.metadata_size() {
            return Err(AeadError::Buffer(format!(
                "a sector of {} bytes with {} metadata bytes, not {} and {}",
                self.sector_size,
                self.kind.metadata_size(),
                data.len(),
                meta.len()
            )));
        }
        Ok(())
    }

    /// Encrypt `data` (one sector, at 512-byte `sector`) in place and write its metadata to
    /// `meta` (at least [`AeadKind::metadata_size`] bytes; the rest zeroed). `random_iv` is the
    /// IV a `random` mode uses (the caller draws it, so writes can be reproduced in tests).
    pub fn seal(
        &self,
        sector: u64,
        data: &mut [u8],
        meta: &mut [u8],
        random_iv: &[u8],
    ) -> Result<(), AeadError> {
        self.check(data, meta)?;
        let k = self.kind;
        let (auth, iv_len) = (k.auth_size(), k.iv_size());
        meta.fill(0);
        if k.stores_iv() {
            if random_iv.len() != iv_len {
                return Err(AeadError::Buffer(format!(
                    "a random IV of {iv_len} bytes, not {}",
                    random_iv.len()
                )));
            }
            meta[auth..auth + iv_len].copy_from_slice(random_iv);
        }
        let iv = self.iv(sector, &meta[auth..]);
        match k {
            AeadKind::AuthencXts { .. } => {
                self.xts(Mode::Encrypt, &iv, data)?;
                let mac = self.hmac(sector, &iv, data)?;
                meta[..auth].copy_from_slice(&mac[..auth]);
            }
            AeadKind::XtsRandom => self.xts(Mode::Encrypt, &iv, data)?,
            AeadKind::AesGcm | AeadKind::ChaCha20Poly1305 => {
                let tag = self.aead(Mode::Encrypt, sector, &iv, data, None)?;
                meta[..auth].copy_from_slice(&tag);
            }
        }
        Ok(())
    }

    /// Verify `data` (one sector of ciphertext at 512-byte `sector`) against its metadata and
    /// decrypt it in place; on [`AeadError::Auth`] `data` is left as it was.
    pub fn open(&self, sector: u64, data: &mut [u8], meta: &[u8]) -> Result<(), AeadError> {
        self.check(data, meta)?;
        let k = self.kind;
        let auth = k.auth_size();
        let iv = self.iv(sector, &meta[auth..]);
        match k {
            AeadKind::AuthencXts { .. } => {
                let mac = self.hmac(sector, &iv, data)?;
                if !memcmp::eq(&mac[..auth], &meta[..auth]) {
                    return Err(AeadError::Auth);
                }
                self.xts(Mode::Decrypt, &iv, data)
            }
            AeadKind::XtsRandom => self.xts(Mode::Decrypt, &iv, data),
            // aead() writes `data` only once the tag has verified.
            AeadKind::AesGcm | AeadKind::ChaCha20Poly1305 => self
                .aead(Mode::Decrypt, sector, &iv, data, Some(&meta[..auth]))
                .map(|_| ()),
        }
    }

    fn xts(&self, mode: Mode, iv: &[u8], data: &mut [u8]) -> Result<(), AeadError> {
        let cipher = match self.enc_key.len() {
            32 => Cipher::aes_128_xts(),
            _ => Cipher::aes_256_xts(),
        };
        let out = run_crypter(cipher, mode, &self.enc_key, iv, data, None, None)?;
        data.copy_from_slice(&out);
        Ok(())
    }

    /// HMAC over le64(sector) || IV || ciphertext.
    fn hmac(&self, sector: u64, iv: &[u8], ct: &[u8]) -> Result<Zeroizing<Vec<u8>>, AeadError> {
        let sector = sector.to_le_bytes();
        let parts: [&[u8]; 3] = [&sector, iv, ct];
        match (&self.mac256, &self.mac512) {
            (Some(k), _) => Ok(Zeroizing::new(k.mac(&parts).to_vec())),
            (_, Some(k)) => Ok(Zeroizing::new(k.mac(&parts).to_vec())),
            _ => Err(AeadError::Buffer(format!(
                "{} has no HMAC",
                self.kind.name()
            ))),
        }
    }

    /// GCM or ChaCha20-Poly1305 over `data` in place with AAD le64(sector) || IV; returns the
    /// tag when encrypting, checks `tag` when decrypting.
    fn aead(
        &self,
        mode: Mode,
        sector: u64,
        iv: &[u8],
        data: &mut [u8],
        tag: Option<&[u8]>,
    ) -> Result<Vec<u8>, AeadError> {
        let cipher = match (self.kind, self.enc_key.len()) {
            (AeadKind::ChaCha20Poly1305, _) => Cipher::chacha20_poly1305(),
            (_, 16) => Cipher::aes_128_gcm(),
            (_, 24) => Cipher::aes_192_gcm(),
            _ => Cipher::aes_256_gcm(),
        };
        let mut aad = Zeroizing::new(sector.to_le_bytes().to_vec());
        aad.extend_from_slice(iv);
        let out = run_crypter(
            cipher,
            mode,
            &self.enc_key,
            iv,
            data,
            Some(&aad),
            match mode {
                Mode::Decrypt => tag,
                Mode::Encrypt => None,
            },
        )
        .map_err(|e| match mode {
            Mode::Decrypt => AeadError::Auth,
            Mode::Encrypt => e,
        })?;
        data.copy_from_slice(&out);
        Ok(out.tag.unwrap_or_default())
    }
}

/// Run `work(first 512-byte sector, data, metadata)` on each part of a batch split into
/// contiguous parts of `per` sectors of `ss` bytes, on this thread and the
/// [helpers](crate::block::helpers) (threads started once, at the first large batch of the
/// process, not one per request: a thread start costs some fifteen system calls), each
/// taking the next part as it finishes one; the results in order.
fn in_parts<'a, M: Send + 'a, R: Send>(
    ss: usize,
    first: u64,
    per: usize,
    parts: impl Iterator<Item = (&'a mut [u8], M)>,
    work: &(dyn Fn(u64, &'a mut [u8], M) -> Result<R, AeadError> + Sync),
) -> Vec<Result<R, AeadError>> {
    let step = (ss / 512) as u64;
    let jobs: Vec<_> = parts
        .enumerate()
        .map(|(i, (d, m))| (first + (i * per) as u64 * step, d, m))
        .collect();
    let threads = jobs.len();
    crate::block::side_by_side::share(jobs, threads, &|(at, d, m)| work(at, d, m))
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(AeadError::Buffer("a crypto thread panicked".into()))))
        .collect()
}

/// The output of one OpenSSL call, with the AEAD tag when one was made.
struct CrypterOut {
    bytes: Zeroizing<Vec<u8>>,
    tag: Option<Vec<u8>>,
}

impl std::ops::Deref for CrypterOut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

fn run_crypter(
    cipher: Cipher,
    mode: Mode,
    key: &[u8],
    iv: &[u8],
    data: &[u8],
    aad: Option<&[u8]>,
    expect_tag: Option<&[u8]>,
) -> Result<CrypterOut, AeadError> {
    let crypto = |e: openssl::error::ErrorStack| AeadError::Buffer(format!("openssl: {e}"));
    let mut c = Crypter::new(cipher, mode, key, Some(iv)).map_err(crypto)?;
    c.pad(false);
    if let Some(a) = aad {
        c.aad_update(a).map_err(crypto)?;
    }
    if let Some(t) = expect_tag {
        c.set_tag(t).map_err(crypto)?;
    }
    let mut out = Zeroizing::new(vec![0u8; data.len() + cipher.block_size()]);
    let mut n = c.update(data, &mut out).map_err(crypto)?;
    n += c.finalize(&mut out[n..]).map_err(crypto)?;
    out.truncate(n);
    let tag = if aad.is_some() && matches!(mode, Mode::Encrypt) {
        let mut t = vec![0u8; 16];
        c.get_tag(&mut t).map_err(crypto)?;
        Some(t)
    } else {
        None
    };
    Ok(CrypterOut { bytes: out, tag })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<(AeadKind, usize)> {
        vec![
            (
                AeadKind::from_luks2("aes-xts-plain64", "hmac(sha256)").unwrap(),
                96,
            ),
            (
                AeadKind::from_luks2("aes-xts-plain64", "hmac(sha512)").unwrap(),
                128,
            ),
            (
                AeadKind::from_luks2("aes-xts-random", "hmac(sha256)").unwrap(),
                96,
            ),
            (AeadKind::from_luks2("aes-gcm-random", "aead").unwrap(), 32),
            (
                AeadKind::from_luks2("chacha20-random", "poly1305").unwrap(),
                32,
            ),
            (AeadKind::from_luks2("aes-xts-random", "none").unwrap(), 64),
        ]
    }

    #[test]
    fn metadata_sizes_are_the_kernels() {
        let sizes: Vec<usize> = all().iter().map(|(k, _)| k.metadata_size()).collect();
        // `dmsetup table` in the guest: integrity:32, :64, :48, :28, :28, :16.
        assert_eq!(sizes, [32, 64, 48, 28, 28, 16]);
    }

    #[test]
    fn seal_then_open_round_trips_and_any_flipped_bit_fails() {
        for (kind, key_len) in all() {
            for ss in [512usize, 4096] {
                let key: Vec<u8> = (0..key_len as u8).collect();
                let a = SectorAead::new(kind, &key, ss).unwrap();
                let plain: Vec<u8> = (0..ss).map(|i| (i * 7 % 251) as u8).collect();
                let mut data = plain.clone();
                let mut meta = vec![0u8; kind.metadata_size() + 3];
                let iv = vec![0x5au8; kind.iv_size()];
                a.seal(80, &mut data, &mut meta, &iv).unwrap();
                assert_ne!(data, plain);
                let mut back = data.clone();
                a.open(80, &mut back, &meta).unwrap();
                assert_eq!(back, plain, "{kind:?} {ss}");
                if kind == AeadKind::XtsRandom {
                    continue;
                }
                for (what, sector, flip_data) in [("data", 80u64, true), ("sector", 88, false)] {
                    let mut d = data.clone();
                    let mut m = meta.clone();
                    if flip_data {
                        d[ss / 2] ^= 1;
                    }
                    assert_eq!(
                        a.open(sector, &mut d, &m),
                        Err(AeadError::Auth),
                        "{kind:?} {what}"
                    );
                    m[0] ^= 0x80;
                    assert_eq!(a.open(80, &mut data.clone(), &m), Err(AeadError::Auth));
                }
            }
        }
    }

    /// The batch calls (the fast authenc path, and the per-sector loop of the others) give
    /// what [`SectorAead::seal`] and [`SectorAead::open`] give sector by sector, and name
    /// exactly the sectors that fail.
    #[test]
    fn batches_match_single_sectors_and_name_the_bad_ones() {
        for (kind, key_len) in all() {
            for ss in [512usize, 4096] {
                let key: Vec<u8> = (0..key_len as u8).map(|b| b.wrapping_mul(13)).collect();
                let a = SectorAead::new(kind, &key, ss).unwrap();
                let n = 5;
                let stride = kind.metadata_size() + 4;
                let plain: Vec<u8> = (0..n * ss).map(|i| (i * 31 % 253) as u8).collect();
                let mut data = plain.clone();
                let mut meta = vec![0xeeu8; n * stride];
                a.seal_sectors(64, &mut data, &mut meta, stride).unwrap();
                if !kind.stores_iv() {
                    // Out of place, on every path: what sealing in place gave.
                    let (mut out, mut out_meta) = (vec![0u8; n * ss], vec![0u8; n * stride]);
                    a.seal_sectors_from(64, &plain, &mut out, &mut out_meta, stride)
                        .unwrap();
                    assert!(
                        out == data && out_meta == meta,
                        "{kind:?} {ss}: out of place"
                    );
                }
                let step = (ss / 512) as u64;
                for i in 0..n {
                    let m = &meta[i * stride..(i + 1) * stride];
                    assert!(m[kind.metadata_size()..].iter().all(|&b| b == 0));
                    let mut one = data[i * ss..(i + 1) * ss].to_vec();
                    a.open(64 + i as u64 * step, &mut one, m).unwrap();
                    assert_eq!(one, plain[i * ss..(i + 1) * ss], "{kind:?} {ss} sector {i}");
                    // And the single-sector seal gives what the batch gave (fixed IVs only).
                    if !kind.stores_iv() {
                        let mut s = plain[i * ss..(i + 1) * ss].to_vec();
                        let mut sm = vec![0u8; stride];
                        a.seal(64 + i as u64 * step, &mut s, &mut sm, &[]).unwrap();
                        assert_eq!(s, data[i * ss..(i + 1) * ss]);
                        assert_eq!(sm, m);
                    }
                }
                let mut back = data.clone();
                assert!(a
                    .open_sectors(64, &mut back, &meta, stride)
                    .unwrap()
                    .is_empty());
                assert_eq!(back, plain);
                if kind == AeadKind::XtsRandom {
                    continue;
                }
                let mut bad = data.clone();
                bad[ss + 7] ^= 4;
                bad[3 * ss] ^= 1;
                let failed = a.open_sectors(64, &mut bad, &meta, stride).unwrap();
                assert_eq!(failed, vec![64 + step, 64 + 3 * step], "{kind:?} {ss}");
                assert!(
                    bad.iter().all(|&b| b == 0),
                    "nothing unauthenticated is returned"
                );
            }
        }
    }

    /// The fast path over several groups of [`FAST_GROUP`] sectors and a ragged last one
    /// equals sector-at-a-time sealing, and names bad sectors on either side of a group's
    /// border.
    #[test]
    fn fast_groups_match_single_sectors_across_group_borders() {
        let kind = AeadKind::AuthencXts {
            sha512: false,
            random_iv: false,
        };
        for ss in [512usize, 4096] {
            let a = SectorAead::new(kind, &key(96), ss).unwrap();
            assert!(a.fast.is_some());
            let n = 2 * FAST_GROUP + 37;
            let stride = kind.metadata_size() + 8;
            let step = (ss / 512) as u64;
            let plain: Vec<u8> = (0..n * ss).map(|i| (i * 7 % 251) as u8).collect();
            let (mut data, mut meta) = (plain.clone(), vec![0x55u8; n * stride]);
            a.seal_sectors(1000, &mut data, &mut meta, stride).unwrap();
            // Out of place (the plaintext at an odd address): the same sectors and metadata.
            let mut src = vec![0u8; n * ss + 1];
            src[1..].copy_from_slice(&plain);
            let (mut out, mut out_meta) = (vec![0u8; n * ss], vec![0x55u8; n * stride]);
            assert!(a.seal_cannot_fail());
            a.seal_sectors_from(1000, &src[1..], &mut out, &mut out_meta, stride)
                .unwrap();
            assert!(out == data && out_meta == meta, "{ss}: seal_sectors_from");
            assert!(a
                .seal_sectors_from(1000, &src, &mut out, &mut out_meta, stride)
                .is_err());
            for i in [0, FAST_GROUP - 1, FAST_GROUP, 2 * FAST_GROUP, n - 1] {
                let mut s = plain[i * ss..(i + 1) * ss].to_vec();
                let mut sm = vec![0u8; stride];
                a.seal(1000 + i as u64 * step, &mut s, &mut sm, &[])
                    .unwrap();
                assert_eq!(s, data[i * ss..(i + 1) * ss], "{ss} sector {i}");
                assert_eq!(sm, meta[i * stride..(i + 1) * stride], "{ss} sector {i}");
            }
            assert_opens(&a, (1000, &data, &meta), stride, &plain, false);
            // A bad sector last in the first group, another first in the last group, and a
            // flipped tag byte (its last) in the middle group.
            let mut bad = data.clone();
            bad[(FAST_GROUP - 1) * ss + 1] ^= 0x80;
            bad[2 * FAST_GROUP * ss] ^= 1;
            let mut bad_meta = meta.clone();
            bad_meta[(FAST_GROUP + 3) * stride + 31] ^= 1;
            let failed = a.open_sectors(1000, &mut bad, &bad_meta, stride).unwrap();
            let at = |i: usize| 1000 + i as u64 * step;
            assert_eq!(
                failed,
                vec![at(FAST_GROUP - 1), at(FAST_GROUP + 3), at(2 * FAST_GROUP)],
                "{ss}"
            );
            assert!(bad.iter().all(|&b| b == 0), "nothing unauthenticated");
        }
    }

    /// The batched authenc path (XTS over runs of sectors, HMAC from the key's pad states in
    /// the multi-buffer lanes, one core or split over the pool) against the portable per-sector
    /// path (OpenSSL's XTS, the `sha2` crate's HMAC): random keys, sector counts on both sides
    /// of a group and of the split, first sectors, metadata strides and buffers at odd
    /// addresses; sealing gives the same bytes, opening gives the plaintext back, and one
    /// flipped bit names its sector.
    #[test]
    fn batched_authenc_matches_portable_per_sector_on_random_shapes() {
        let kind = AeadKind::AuthencXts {
            sha512: false,
            random_iv: false,
        };
        let mut seed = 0x2700u64;
        let mut rand = move || {
            seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for round in 0..16 {
            let ss = [512usize, 4096][(rand() % 2) as usize];
            let key_len = [64usize, 96][(rand() % 2) as usize];
            let key: Vec<u8> = (0..key_len).map(|_| rand() as u8).collect();
            let a = SectorAead::new(kind, &key, ss).unwrap();
            let n = match round % 4 {
                0 => 1 + (rand() % 8) as usize,
                1 => FAST_GROUP - 1 + (rand() % 3) as usize,
                _ => 2 * PARALLEL_MIN / ss + (rand() % (3 * FAST_GROUP as u64)) as usize,
            };
            let stride = 32 + (rand() % 17) as usize;
            let step = (ss / 512) as u64;
            let first = (rand() % (1 << 40)) * step;
            let align = 1 + (rand() % 15) as usize;
            let mut raw: Vec<u8> = (0..align + n * ss).map(|_| rand() as u8).collect();
            let plain = raw[align..].to_vec();
            let mut meta_raw = vec![0xa5u8; align + n * stride];
            let (data, meta) = (&mut raw[align..], &mut meta_raw[align..]);
            if round % 2 == 0 {
                a.seal_sectors(first, data, meta, stride).unwrap();
            } else {
                a.seal_sectors_parallel(first, data, meta, stride).unwrap();
            }
            for i in 0..n {
                let at = first + i as u64 * step;
                let mut s = plain[i * ss..(i + 1) * ss].to_vec();
                let mut sm = vec![0u8; stride];
                a.seal(at, &mut s, &mut sm, &[]).unwrap();
                assert!(
                    s == data[i * ss..(i + 1) * ss],
                    "round {round} {ss} sector {i}"
                );
                assert_eq!(sm, meta[i * stride..(i + 1) * stride], "round {round} {i}");
            }
            let parallel = round % 3 == 0;
            assert_opens(&a, (first, data, meta), stride, &plain, parallel);
            let i = (rand() % n as u64) as usize;
            let mut bad = data.to_vec();
            bad[i * ss + (rand() % ss as u64) as usize] ^= 1 << (rand() % 8);
            let failed = if parallel {
                a.open_sectors_parallel(first, &mut bad, meta, stride)
            } else {
                a.open_sectors(first, &mut bad, meta, stride)
            };
            assert_eq!(
                failed.unwrap(),
                vec![first + i as u64 * step],
                "round {round}"
            );
            assert!(bad.iter().all(|&b| b == 0), "nothing unauthenticated");
        }
    }

    #[test]
    fn mac_comparison_sees_every_byte() {
        let a: Vec<u8> = (0..32u8).collect();
        assert!(macs_equal(&a, &a.clone()));
        for i in 0..32 {
            for bit in [1u8, 0x80] {
                let mut b = a.clone();
                b[i] ^= bit;
                assert!(!macs_equal(&a, &b), "byte {i}");
            }
        }
        assert!(macs_equal(&a[..13], &a[..13]));
        let mut b = a[..13].to_vec();
        b[12] ^= 2;
        assert!(!macs_equal(&a[..13], &b));
    }

    /// Split over threads, a large batch seals as one call does, and a bad sector in any
    /// part is named.
    #[test]
    fn parallel_batches_match_and_name_bad_sectors_in_every_part() {
        for (kind, key_len) in all() {
            let ss = 512usize;
            let a = SectorAead::new(kind, &key(key_len), ss).unwrap();
            let len = 4 * PARALLEL_MIN;
            let n = len / ss;
            let stride = kind.metadata_size();
            let plain: Vec<u8> = (0..len).map(|i| (i * 13 % 241) as u8).collect();
            let (mut d1, mut m1) = (plain.clone(), vec![0u8; n * stride]);
            a.seal_sectors_parallel(8, &mut d1, &mut m1, stride)
                .unwrap();
            if !kind.stores_iv() {
                let (mut d2, mut m2) = (plain.clone(), vec![0u8; n * stride]);
                a.seal_sectors(8, &mut d2, &mut m2, stride).unwrap();
                assert!(d1 == d2 && m1 == m2, "{kind:?}");
            }
            assert_opens(&a, (8, &d1, &m1), stride, &plain, true);
            if kind == AeadKind::XtsRandom {
                continue;
            }
            let mut bad = d1.clone();
            bad[3] ^= 1;
            bad[len - 1] ^= 1;
            let failed = a.open_sectors_parallel(8, &mut bad, &m1, stride).unwrap();
            assert_eq!(failed, vec![8, 8 + n as u64 - 1], "{kind:?}");
            assert!(bad.iter().all(|&b| b == 0));
        }
    }

    /// Open a copy of `sealed` (first 512-byte sector, sectors, metadata), in one call or
    /// split over threads: every sector verifies and gives `plain`.
    fn assert_opens(
        a: &SectorAead,
        (first, sealed, meta): (u64, &[u8], &[u8]),
        stride: usize,
        plain: &[u8],
        parallel: bool,
    ) {
        let mut back = sealed.to_vec();
        let bad = if parallel {
            a.open_sectors_parallel(first, &mut back, meta, stride)
        } else {
            a.open_sectors(first, &mut back, meta, stride)
        };
        assert_eq!(bad.unwrap(), Vec::<u64>::new(), "{:?}", a.kind());
        assert!(back == plain, "{:?}", a.kind());
    }

    fn key(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 17 + 5) as u8).collect()
    }

    #[test]
    fn wrong_pairs_and_key_sizes_are_refused() {
        assert!(AeadKind::from_luks2("aes-cbc-essiv:sha256", "hmac(sha256)").is_err());
        let k = AeadKind::AesGcm;
        assert!(matches!(
            SectorAead::new(k, &[0u8; 33], 512),
            Err(AeadError::KeySize { .. })
        ));
    }
}
