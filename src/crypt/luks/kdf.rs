//! Key derivation: PBKDF2 (OpenSSL, or RustCrypto for Whirlpool) and Argon2i/Argon2id (the
//! `argon2` crate, lanes computed in parallel on a private pool), plus the benchmarks behind
//! `--iter-time`.

use super::af::message_digest;
use super::LuksError;
use crate::crypt::secret::SecretBytes;
use std::time::{Duration, Instant};

/// Which Argon2 variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argon2Variant {
    /// Argon2i (data-independent addressing).
    I,
    /// Argon2id (hybrid; cryptsetup's default for LUKS2).
    Id,
}

impl Argon2Variant {
    /// The name in LUKS2 metadata.
    pub fn name(self) -> &'static str {
        match self {
            Argon2Variant::I => "argon2i",
            Argon2Variant::Id => "argon2id",
        }
    }
}

/// A key derivation function with its parameters, as a LUKS keyslot stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kdf {
    /// PBKDF2-HMAC.
    Pbkdf2 {
        /// Hash of the HMAC ("sha256", ...).
        hash: String,
        /// Iteration count.
        iterations: u32,
        /// Salt.
        salt: Vec<u8>,
    },
    /// Argon2i or Argon2id, version 0x13.
    Argon2 {
        /// Variant.
        variant: Argon2Variant,
        /// Time cost (passes).
        time: u32,
        /// Memory cost in KiB.
        memory: u32,
        /// Lanes (cryptsetup's "cpus"/threads).
        cpus: u32,
        /// Salt.
        salt: Vec<u8>,
    },
}

/// Largest Argon2 memory cost cryptsetup accepts (4 GiB in KiB).
pub const MAX_ARGON2_MEMORY_KIB: u32 = 4 * 1024 * 1024;
/// Most Argon2 lanes cryptsetup accepts.
pub const MAX_ARGON2_CPUS: u32 = 16;

impl Kdf {
    /// The salt.
    pub fn salt(&self) -> &[u8] {
        match self {
            Kdf::Pbkdf2 { salt, .. } | Kdf::Argon2 { salt, .. } => salt,
        }
    }

    /// Derive `out_len` bytes from `passphrase`.
    ///
    /// Parameters are checked here, not when the header is read, as cryptsetup does: a keyslot
    /// whose KDF cannot run fails this call ([`LuksError::Invalid`], cryptsetup's "Keyslot
    /// open failed.", exit 1), one whose memory cannot be had fails with
    /// [`LuksError::NoMemory`] (exit 3); any other parameters are simply computed, so a wrong
    /// passphrase is told apart later by the digest (exit 2).
    pub fn derive(&self, passphrase: &[u8], out_len: usize) -> Result<SecretBytes, LuksError> {
        let mut out = SecretBytes::zeroed(out_len);
        match self {
            Kdf::Pbkdf2 {
                hash,
                iterations,
                salt,
            } => pbkdf2(hash, passphrase, salt, *iterations, &mut out)?,
            Kdf::Argon2 {
                variant,
                time,
                memory,
                cpus,
                salt,
            } => argon2(*variant, *time, *memory, *cpus, passphrase, salt, &mut out)?,
        }
        Ok(out)
    }
}

/// Argon2 into `out`, lanes on threads of a private pool that is gone when this returns.
fn argon2(
    variant: Argon2Variant,
    time: u32,
    memory: u32,
    cpus: u32,
    passphrase: &[u8],
    salt: &[u8],
    out: &mut [u8],
) -> Result<(), LuksError> {
    let what = format!(
        "{} time {time}, memory {memory} KiB, cpus {cpus}",
        variant.name()
    );
    let algorithm = match variant {
        Argon2Variant::I => argon2::Algorithm::Argon2i,
        Argon2Variant::Id => argon2::Algorithm::Argon2id,
    };
    // The argon2 reference library's checks (time >= 1, 1..2^24 lanes, memory >= 8 blocks per
    // lane) are argon2::Params' checks too.
    let params = argon2::Params::new(memory, time, cpus, Some(out.len()))
        .map_err(|e| LuksError::Invalid(format!("{what}: {e}")))?;
    // The memory is allocated here, fallibly (an absurd size from a header is an error, not an
    // abort), and wiped before it is freed: it holds state derived from the passphrase.
    let mut blocks: Vec<argon2::Block> = Vec::new();
    blocks
        .try_reserve_exact(params.block_count())
        .map_err(|_| LuksError::NoMemory(what.clone()))?;
    blocks.resize_with(params.block_count(), argon2::Block::default);
    let a = argon2::Argon2::new(algorithm, argon2::Version::V0x13, params);
    let r = on_private_threads(cpus, || {
        a.hash_password_into_with_memory(passphrase, salt, &mut *out, &mut blocks[..])
    });
    zeroize::Zeroize::zeroize(&mut blocks);
    r?.map_err(|e| LuksError::Invalid(format!("{what}: {e}")))
}

/// Run `f` (Argon2's lanes) on a rayon pool of its own, at most one thread per lane and per
/// CPU, and return only once every thread of that pool has ended.
///
/// `open` forks its server without exec after unlocking and refuses a process that runs more
/// than one thread, so the KDF must leave none behind, for any lane count: the pool's threads
/// are scoped threads, joined when the scope ends (a dropped rayon pool alone only asks its
/// threads to stop). Running `f` on the calling thread instead would start rayon's global pool
/// at the first parallel call, whose threads never end.
fn on_private_threads<T: Send>(lanes: u32, f: impl FnOnce() -> T + Send) -> Result<T, LuksError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (lanes as usize).clamp(1, cpus);
    std::thread::scope(|scope| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .spawn_handler(|t| {
                std::thread::Builder::new()
                    .name("dmkit-kdf".into())
                    .spawn_scoped(scope, move || t.run())
                    .map(|_| ())
            })
            .build()
            .map_err(|e| LuksError::Crypto(format!("argon2: cannot start threads: {e}")))?;
        let out = pool.install(f);
        // Dropping the pool ends its threads; the scope then joins them.
        drop(pool);
        Ok(out)
    })
}

/// PBKDF2-HMAC-`hash` into `out`.
pub fn pbkdf2(
    hash: &str,
    passphrase: &[u8],
    salt: &[u8],
    iterations: u32,
    out: &mut [u8],
) -> Result<(), LuksError> {
    if iterations == 0 {
        return Err(LuksError::Invalid("PBKDF2 with 0 iterations".into()));
    }
    // OpenSSL takes an int; metadata can ask for more (hours of work in any case).
    if iterations > i32::MAX as u32 {
        return Err(LuksError::Invalid(format!(
            "PBKDF2 with {iterations} iterations (more than 2^31 - 1)"
        )));
    }
    message_digest(hash)?
        .pbkdf2(passphrase, salt, iterations, out)
        .map_err(|e| LuksError::Crypto(format!("pbkdf2-{hash}: {e}")))
}

/// Fewest PBKDF2 iterations cryptsetup uses.
pub const MIN_PBKDF2_ITERATIONS: u32 = 1000;
/// Fewest Argon2 passes cryptsetup uses.
pub const MIN_ARGON2_TIME: u32 = 4;

/// PBKDF2 iterations that take about `ms` milliseconds here (at least 1000), measured like
/// cryptsetup's benchmark: time a trial run and scale.
pub fn benchmark_pbkdf2(hash: &str, key_len: usize, ms: u32) -> Result<u32, LuksError> {
    let mut out = vec![0u8; key_len];
    let mut trial: u32 = 1 << 14;
    loop {
        let t = Instant::now();
        pbkdf2(hash, b"benchmark passphrase", &[0u8; 32], trial, &mut out)?;
        let spent = t.elapsed();
        // Scale from a run long enough that timer noise does not matter.
        if spent >= Duration::from_millis(50) || trial >= 1 << 26 {
            let per_ms = trial as f64 / spent.as_secs_f64().max(1e-6) / 1000.0;
            let n = (per_ms * ms as f64).min(u32::MAX as f64) as u32;
            return Ok(n.max(MIN_PBKDF2_ITERATIONS));
        }
        trial *= 4;
    }
}

/// Argon2 (time, memory KiB) that take about `ms` milliseconds with `cpus` lanes: memory stays
/// at `max_memory` unless even the fewest passes are too slow, then it shrinks.
pub fn benchmark_argon2(
    variant: Argon2Variant,
    max_memory: u32,
    cpus: u32,
    key_len: usize,
    ms: u32,
) -> Result<(u32, u32), LuksError> {
    let mut memory = max_memory.max(8 * cpus);
    let target = Duration::from_millis(ms as u64);
    loop {
        let kdf = Kdf::Argon2 {
            variant,
            time: MIN_ARGON2_TIME,
            memory,
            cpus,
            salt: vec![0u8; 32],
        };
        let t = Instant::now();
        kdf.derive(b"benchmark passphrase", key_len)?;
        let spent = t.elapsed();
        if spent > target && memory > 32 * 1024 {
            memory = (memory as f64 * target.as_secs_f64() / spent.as_secs_f64()) as u32;
            memory = memory.max(32 * 1024);
            continue;
        }
        let scale = target.as_secs_f64() / spent.as_secs_f64().max(1e-6);
        let time = ((MIN_ARGON2_TIME as f64) * scale) as u32;
        return Ok((time.max(MIN_ARGON2_TIME), memory));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pbkdf2_rfc6070_vector() {
        let mut out = [0u8; 20];
        pbkdf2("sha1", b"password", b"salt", 2, &mut out).unwrap();
        assert_eq!(hex::encode(out), "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
    }

    #[test]
    fn argon2id_rfc9106_shape() {
        // Same parameters, same output, whatever the thread count on this machine.
        let k = Kdf::Argon2 {
            variant: Argon2Variant::Id,
            time: 1,
            memory: 64,
            cpus: 4,
            salt: vec![2u8; 16],
        };
        let a = k.derive(b"pw", 32).unwrap();
        let b = k.derive(b"pw", 32).unwrap();
        assert_eq!(a, b);
    }
}
