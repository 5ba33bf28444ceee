//! The crypt target: a read-write [`BlockDevice`] that encrypts what it writes to, and decrypts
//! what it reads from, a lower device, sector by sector, as dm-crypt does.
//!
//! Table parameters map to dm-crypt's: `offset` is the target's `start` (in bytes here),
//! `iv_offset` is dm-crypt's `iv_offset` (LUKS2 `iv_tweak`, 512-byte units), `sector_size`
//! and `iv_large_sectors` are the optional parameters of the same names, and `allow_discards`
//! lets discards through.
//!
//! The work is done inline on the serving thread: a read goes into the caller's buffer and is
//! decrypted in place; a write is encrypted into a per-thread reusable buffer, then written.

use crate::block::{check_range, BlockDevice, BlockError, Result};
use crate::crypt::cipher::SectorCipher;
use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Geometry and options of a crypt target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CryptParams {
    /// Name used in messages and `status`.
    pub name: String,
    /// Where the encrypted data starts on the lower device, bytes (a multiple of 512).
    pub offset: u64,
    /// Size of the decrypted device, bytes (a non-zero multiple of `sector_size`).
    pub size: u64,
    /// Encryption sector size: a power of two from 512 to 4096.
    pub sector_size: u32,
    /// Added to the sector number before the IV is computed, in 512-byte units (dm-crypt's
    /// `iv_offset`, LUKS2's `iv_tweak`, cryptsetup plain mode's `--skip`).
    pub iv_offset: u64,
    /// Count IV sectors in `sector_size` units instead of 512-byte units.
    pub iv_large_sectors: bool,
    /// Pass discards down to the lower device (otherwise they are refused).
    pub allow_discards: bool,
    /// Refuse writes.
    pub read_only: bool,
}

impl CryptParams {
    /// Parameters for `size` bytes at byte `offset`, 512-byte sectors, no IV offset,
    /// read-write, no discards.
    pub fn new(name: &str, offset: u64, size: u64) -> CryptParams {
        CryptParams {
            name: name.to_string(),
            offset,
            size,
            sector_size: 512,
            iv_offset: 0,
            iv_large_sectors: false,
            allow_discards: false,
            read_only: false,
        }
    }
}

/// Why a crypt target cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    /// A parameter is out of range or inconsistent with the lower device.
    #[error("{device}: {field}: {reason}")]
    Invalid {
        /// Device name.
        device: String,
        /// The parameter ("sector_size", "offset", ...).
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Counters shown by `dmkit status`.
#[derive(Debug, Default)]
pub struct CryptStats {
    /// Sectors decrypted.
    pub sectors_decrypted: AtomicU64,
    /// Sectors encrypted.
    pub sectors_encrypted: AtomicU64,
    /// Discard requests passed down.
    pub discards: AtomicU64,
}

impl CryptStats {
    /// The counters as JSON, for `status`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "sectors_decrypted": self.sectors_decrypted.load(Ordering::Relaxed),
            "sectors_encrypted": self.sectors_encrypted.load(Ordering::Relaxed),
            "discards": self.discards.load(Ordering::Relaxed),
        })
    }
}

/// A dm-crypt target.
pub struct CryptDevice {
    lower: Arc<dyn BlockDevice>,
    /// Shared with the targets [`CryptDevice::reshaped`] makes from this one: the key
    /// schedule is wiped when the last of them goes.
    cipher: Arc<dyn SectorCipher>,
    p: CryptParams,
    /// log2(sector_size / 512).
    shift: u32,
    stats: Arc<CryptStats>,
}

/// Largest piece of a write encrypted at once (bounds the per-thread buffer).
const WRITE_CHUNK: usize = 1 << 20;

thread_local! {
    /// Ciphertext of the write being served on this thread (holds no plaintext).
    static WRITE_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl CryptDevice {
    /// Check `p` against `lower` and build the target.
    pub fn new(
        lower: Arc<dyn BlockDevice>,
        cipher: Box<dyn SectorCipher>,
        p: CryptParams,
    ) -> std::result::Result<CryptDevice, CryptError> {
        Self::build(lower, Arc::from(cipher), p)
    }

    fn build(
        lower: Arc<dyn BlockDevice>,
        cipher: Arc<dyn SectorCipher>,
        p: CryptParams,
    ) -> std::result::Result<CryptDevice, CryptError> {
        let bad = |field: &'static str, reason: String| CryptError::Invalid {
            device: p.name.clone(),
            field,
            reason,
        };
        let ss = p.sector_size;
        if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
            return Err(bad(
                "sector_size",
                format!("{ss} is not a power of two from 512 to 4096"),
            ));
        }
        if !p.offset.is_multiple_of(512) {
            return Err(bad(
                "offset",
                format!("{} bytes is not a multiple of 512", p.offset),
            ));
        }
        if p.size == 0 || !p.size.is_multiple_of(u64::from(ss)) {
            return Err(bad(
                "size",
                format!(
                    "{} bytes is not a non-zero multiple of the sector size {ss}",
                    p.size
                ),
            ));
        }
        let shift = (ss / 512).trailing_zeros();
        if p.iv_large_sectors && p.iv_offset & ((1u64 << shift) - 1) != 0 {
            return Err(bad(
                "iv_offset",
                format!(
                    "{} is not a multiple of {} 512-byte sectors, which iv_large_sectors with sector size {ss} needs",
                    p.iv_offset,
                    1u64 << shift
                ),
            ));
        }
        let lower_size = lower.size();
        match p.offset.checked_add(p.size) {
            Some(end) if end <= lower_size => {}
            _ => {
                return Err(bad(
                    "size",
                    format!(
                        "{} bytes at offset {} reach beyond the end of {} ({lower_size} bytes)",
                        p.size,
                        p.offset,
                        lower.name()
                    ),
                ))
            }
        }
        let mut p = p;
        p.read_only |= lower.read_only();
        Ok(CryptDevice {
            lower,
            cipher,
            p,
            shift,
            stats: Arc::new(CryptStats::default()),
        })
    }

    /// The same target (same key, same counters) over `lower` with `size` bytes and discards
    /// as `allow_discards` says: a table reload of dm-crypt that keeps its key (`resize`).
    pub fn reshaped(
        &self,
        lower: Arc<dyn BlockDevice>,
        size: u64,
        allow_discards: bool,
    ) -> std::result::Result<CryptDevice, CryptError> {
        let mut p = self.p.clone();
        p.size = size;
        p.allow_discards = allow_discards;
        let mut d = CryptDevice::build(lower, self.cipher.clone(), p)?;
        d.stats = self.stats.clone();
        Ok(d)
    }

    /// The parameters (with `read_only` set if the lower device is read-only).
    pub fn params(&self) -> &CryptParams {
        &self.p
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<CryptStats> {
        self.stats.clone()
    }

    /// Which cipher implementation runs ("vaes-avx512", "openssl-evp").
    pub fn cipher_implementation(&self) -> &'static str {
        self.cipher.implementation()
    }

    /// The IV sector number of the sector at byte `offset` of this device, as dm-crypt
    /// computes it.
    pub fn iv_sector(&self, offset: u64) -> u64 {
        let s = (offset >> 9).wrapping_add(self.p.iv_offset);
        if self.p.iv_large_sectors {
            s >> self.shift
        } else {
            s
        }
    }

    fn invalid(&self, offset: u64) -> BlockError {
        BlockError::Io {
            device: self.p.name.clone(),
            offset,
            source: io::Error::from_raw_os_error(libc::EINVAL),
        }
    }

    /// Range and alignment checks of a request.
    fn check(&self, offset: u64, len: usize) -> Result<()> {
        check_range(&self.p.name, offset, len, self.p.size)?;
        let mask = u64::from(self.p.sector_size) - 1;
        if offset & mask != 0 || len as u64 & mask != 0 {
            return Err(self.invalid(offset));
        }
        Ok(())
    }

    /// Run the cipher over whole sectors of `buf`, the first at byte `offset`.
    fn crypt(&self, buf: &mut [u8], offset: u64, decrypt: bool) {
        let ss = self.p.sector_size as usize;
        let first = self.iv_sector(offset);
        let run = |b: &mut [u8], iv: u64| {
            if decrypt {
                self.cipher.decrypt(b, iv, ss)
            } else {
                self.cipher.encrypt(b, iv, ss)
            }
        };
        if self.p.iv_large_sectors || self.shift == 0 {
            // Consecutive sectors have consecutive IV sectors: one call.
            run(buf, first);
        } else {
            // IV sectors advance by sector_size / 512 per sector.
            let step = 1u64 << self.shift;
            for (i, s) in buf.chunks_exact_mut(ss).enumerate() {
                run(s, first.wrapping_add(i as u64 * step));
            }
        }
        let n = (buf.len() / ss) as u64;
        let counter = if decrypt {
            &self.stats.sectors_decrypted
        } else {
            &self.stats.sectors_encrypted
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl BlockDevice for CryptDevice {
    fn name(&self) -> &str {
        &self.p.name
    }
    fn size(&self) -> u64 {
        self.p.size
    }
    fn logical_block_size(&self) -> u32 {
        self.p.sector_size
    }
    fn read_only(&self) -> bool {
        self.p.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        self.lower.read_at(buf, self.p.offset + offset)?;
        self.crypt(buf, offset, true);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.p.read_only {
            return Err(BlockError::ReadOnly {
                device: self.p.name.clone(),
            });
        }
        self.check(offset, buf.len())?;
        WRITE_BUF.with(|w| {
            // A re-entrant use (a lower layer that is itself a crypt target served on the
            // same thread) gets its own buffer.
            let mut own = Vec::new();
            let mut guard = w.try_borrow_mut();
            let scratch = match guard.as_mut() {
                Ok(b) => &mut **b,
                Err(_) => &mut own,
            };
            let chunk = WRITE_CHUNK - WRITE_CHUNK % self.p.sector_size as usize;
            let mut done = 0usize;
            while done < buf.len() {
                let n = chunk.min(buf.len() - done);
                scratch.clear();
                scratch.extend_from_slice(&buf[done..done + n]);
                let off = offset + done as u64;
                self.crypt(scratch, off, false);
                self.lower.write_at(scratch, self.p.offset + off)?;
                done += n;
            }
            Ok(())
        })
    }
    fn flush(&self) -> Result<()> {
        self.lower.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if !self.p.allow_discards {
            return Err(BlockError::Unsupported {
                device: self.p.name.clone(),
                op: "discard (open with --allow-discards)",
            });
        }
        if self.p.read_only {
            return Err(BlockError::ReadOnly {
                device: self.p.name.clone(),
            });
        }
        let len_usize = usize::try_from(len).map_err(|_| self.invalid(offset))?;
        self.check(offset, len_usize)?;
        self.stats.discards.fetch_add(1, Ordering::Relaxed);
        self.lower.discard(self.p.offset + offset, len)
    }
    fn hand_over(&self) {
        self.lower.hand_over()
    }
    // A read-only LUKS image over a URL waits on the network below: its export then keeps
    // several requests in flight, as for remote verity.
    fn blocks_on_network(&self) -> bool {
        self.lower.blocks_on_network()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{Fault, FaultKind, FaultyDevice, MemoryDevice, OpKind};
    use crate::crypt::cipher::{new_sector_cipher, CipherSpec};

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn cipher(spec: &str) -> Box<dyn SectorCipher> {
        let key: Vec<u8> = (0..64u8)
            .map(|i| i.wrapping_mul(7).wrapping_add(3))
            .collect();
        new_sector_cipher(&CipherSpec::parse(spec).unwrap(), &key).unwrap()
    }

    fn device(lower: Arc<dyn BlockDevice>, p: CryptParams) -> CryptDevice {
        CryptDevice::new(lower, cipher("aes-xts-plain64"), p).unwrap()
    }

    #[test]
    fn round_trip_and_layout() {
        for (ss, large, iv_offset) in [
            (512u32, false, 0u64),
            (4096, false, 24),
            (4096, true, 16),
            (1024, true, 2),
            (2048, false, 5),
        ] {
            let mem = Arc::new(MemoryDevice::new("lower", 1 << 20));
            let mut p = CryptParams::new("c", 8192, 512 << 10);
            p.sector_size = ss;
            p.iv_large_sectors = large;
            p.iv_offset = iv_offset;
            let dev = device(mem.clone(), p);
            let data = pattern(64 << 10, ss as u8);
            dev.write_at(&data, 3 * u64::from(ss)).unwrap();
            let mut back = vec![0u8; data.len()];
            dev.read_at(&mut back, 3 * u64::from(ss)).unwrap();
            assert_eq!(back, data);
            // On the lower device: each sector encrypted on its own with dm-crypt's IV.
            let raw = mem.contents();
            let c = cipher("aes-xts-plain64");
            for (i, s) in data.chunks(ss as usize).enumerate() {
                let at = 8192 + (3 + i) * ss as usize;
                let mut x = raw[at..at + ss as usize].to_vec();
                assert_ne!(x, s);
                let s512 = ((3 + i) * ss as usize / 512) as u64 + iv_offset;
                let iv = if large {
                    s512 / u64::from(ss / 512)
                } else {
                    s512
                };
                c.decrypt(&mut x, iv, ss as usize);
                assert_eq!(x, s, "sector {i}, ss {ss}");
            }
            assert!(raw[..8192].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn rejects_bad_requests_and_parameters() {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("lower", 1 << 20));
        let mut p = CryptParams::new("c", 0, 1 << 20);
        p.sector_size = 4096;
        let dev = device(mem.clone(), p);
        let mut b = vec![0u8; 4096];
        let e = dev.read_at(&mut b, 512).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert_eq!(
            dev.write_at(&b[..512], 0).unwrap_err().errno(),
            libc::EINVAL
        );
        assert_eq!(
            dev.read_at(&mut b, 1 << 20).unwrap_err().errno(),
            libc::EINVAL
        );
        assert_eq!(dev.discard(0, 4096).unwrap_err().errno(), libc::EOPNOTSUPP);
        assert_eq!(dev.logical_block_size(), 4096);

        let cases: Vec<(CryptParams, &str)> = vec![
            (
                CryptParams {
                    sector_size: 768,
                    ..CryptParams::new("c", 0, 4096)
                },
                "c: sector_size: 768",
            ),
            (
                CryptParams {
                    sector_size: 8192,
                    ..CryptParams::new("c", 0, 8192)
                },
                "sector_size",
            ),
            (CryptParams::new("c", 100, 4096), "c: offset: 100 bytes"),
            (CryptParams::new("c", 0, 1000), "c: size: 1000 bytes"),
            (CryptParams::new("c", 0, 0), "c: size"),
            (
                CryptParams::new("c", 4096, 1 << 20),
                "beyond the end of lower",
            ),
            (
                CryptParams {
                    sector_size: 4096,
                    iv_large_sectors: true,
                    iv_offset: 3,
                    ..CryptParams::new("c", 0, 8192)
                },
                "c: iv_offset: 3",
            ),
        ];
        for (p, want) in cases {
            let e = CryptDevice::new(mem.clone(), cipher("aes-xts-plain64"), p)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(want), "{e} / {want}");
        }
    }

    #[test]
    fn read_only_and_discards() {
        let mem = Arc::new(MemoryDevice::new("lower", 64 << 10));
        let p = CryptParams {
            read_only: true,
            ..CryptParams::new("c", 0, 64 << 10)
        };
        let dev = device(mem.clone(), p);
        assert_eq!(
            dev.write_at(&[0u8; 512], 0).unwrap_err().errno(),
            libc::EROFS
        );
        let ro = Arc::new(MemoryDevice::new("lower", 64 << 10).into_read_only());
        let dev = device(ro, CryptParams::new("c", 0, 64 << 10));
        assert!(dev.read_only());
        // allow_discards passes the range down, shifted by the data offset (the memory
        // device zeroes it).
        let p = CryptParams {
            allow_discards: true,
            ..CryptParams::new("c", 4096, 32 << 10)
        };
        let dev = device(mem.clone(), p);
        dev.write_at(&[7u8; 8192], 0).unwrap();
        dev.discard(4096, 4096).unwrap();
        let raw = mem.contents();
        assert!(raw[4096..8192].iter().any(|&b| b != 0));
        assert!(raw[8192..12288].iter().all(|&b| b == 0));
        assert_eq!(dev.discard(0, 100).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(dev.stats().discards.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn lower_faults_surface_and_corruption_garbles_one_sector() {
        let faulty = Arc::new(FaultyDevice::new(MemoryDevice::new("lower", 64 << 10)));
        let dev = device(faulty.clone(), CryptParams::new("c", 0, 64 << 10));
        let data = pattern(8192, 9);
        dev.write_at(&data, 0).unwrap();
        faulty.arm(Fault {
            op: OpKind::Read,
            offset_range: None,
            nth: 0,
            kind: FaultKind::Fail,
            sticky: false,
        });
        let mut b = vec![0u8; 8192];
        assert_eq!(dev.read_at(&mut b, 0).unwrap_err().errno(), libc::EIO);
        faulty.arm(Fault {
            op: OpKind::Write,
            offset_range: None,
            nth: 0,
            kind: FaultKind::Fail,
            sticky: false,
        });
        assert!(dev.write_at(&data, 0).is_err());
        // A flipped ciphertext bit garbles its whole 16-byte XTS block, nothing else.
        faulty.arm(Fault {
            op: OpKind::Read,
            offset_range: None,
            nth: 0,
            kind: FaultKind::Corrupt { bit: 8 * 1000 },
            sticky: false,
        });
        dev.read_at(&mut b, 0).unwrap();
        let diff: Vec<usize> = (0..8192).filter(|&i| b[i] != data[i]).collect();
        assert!(!diff.is_empty());
        assert!(diff.iter().all(|&i| (992..1008).contains(&i)), "{diff:?}");
    }

    #[test]
    fn large_writes_are_chunked_correctly() {
        let mem = Arc::new(MemoryDevice::new("lower", 4 << 20));
        let dev = device(mem, CryptParams::new("c", 0, 4 << 20));
        let data = pattern(3 << 20, 1);
        dev.write_at(&data, 512).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read_at(&mut back, 512).unwrap();
        assert_eq!(back, data);
    }
}
