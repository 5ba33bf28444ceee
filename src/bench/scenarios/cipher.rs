//! `dmkit bench cipher`: our in-process AES-XTS throughput for 4 KiB sectors, one
//! `SectorCipher` call per sector on one thread (what the crypt target pays per request), next
//! to `openssl speed -evp aes-256-xts -bytes 8192` measured in the same run; then AES-CBC,
//! serpent, twofish and AES-LRW for reference.

use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::crypt::cipher::{new_sector_cipher_with, random_key, CipherImpl, CipherSpec};

use crate::bench::harness::process::Interrupt;
use crate::bench::BenchError;

use super::bound::{self, rate};

/// The project's target: our aes-xts-plain64 (512-bit key) at least this fraction of
/// `openssl speed -evp aes-256-xts -bytes 8192`.
pub const TARGET: f64 = 0.85;

/// One measured configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CipherSpeed {
    /// dm-crypt cipher name.
    pub spec: String,
    /// Key size, bits.
    pub key_bits: usize,
    /// Implementation that ran.
    pub implementation: String,
    /// Sector size, bytes (one call per sector).
    pub sector_size: usize,
    /// Encryption, bytes per second.
    pub encrypt_bytes_per_s: f64,
    /// Decryption, bytes per second.
    pub decrypt_bytes_per_s: f64,
    /// Encryption on every core at once (one cipher and buffer per thread), bytes per second
    /// in total: what a request split over the cores can reach.
    #[serde(default)]
    pub encrypt_all_cores_bytes_per_s: f64,
    /// Threads of that measurement.
    #[serde(default)]
    pub threads: usize,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CipherReport {
    /// Our figures.
    pub ours: Vec<CipherSpeed>,
    /// `openssl speed -evp aes-256-xts -bytes 8192`, bytes per second (None if openssl failed).
    pub openssl_speed_bytes_per_s: Option<f64>,
    /// The exact command.
    pub openssl_command: String,
    /// `openssl version`.
    pub openssl_version: String,
    /// Seconds per measurement.
    pub seconds: f64,
}

impl CipherReport {
    /// Our best aes-xts-plain64 512-bit encryption figure over openssl speed's.
    pub fn headline_ratio(&self) -> Option<f64> {
        let best = self
            .ours
            .iter()
            .filter(|s| s.key_bits == 512 && s.sector_size == 4096)
            .map(|s| s.encrypt_bytes_per_s)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
        Some(best / self.openssl_speed_bytes_per_s?)
    }
}

/// Measure one implementation: `sector_size`-byte sectors, one call per sector, cycling over
/// a 64 KiB buffer (hot in cache, like `openssl speed`'s).
pub fn measure(
    spec: &str,
    key_len: usize,
    imp: CipherImpl,
    sector_size: usize,
    dur: Duration,
) -> Result<CipherSpeed, BenchError> {
    let parsed = CipherSpec::parse(spec).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let key = random_key(key_len).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let c = new_sector_cipher_with(&parsed, &key, imp)
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let sectors = (65536 / sector_size).max(1);
    // One worker: its own cipher and buffer, one sector per call, either direction.
    let worker = |decrypt: bool| {
        let c = new_sector_cipher_with(&parsed, &key, imp).expect("built once above");
        let mut buf = vec![0x5au8; sectors * sector_size];
        let mut i = 0usize;
        move || {
            let k = i % sectors;
            let s = &mut buf[k * sector_size..(k + 1) * sector_size];
            if decrypt {
                c.decrypt(s, i as u64, sector_size)
            } else {
                c.encrypt(s, i as u64, sector_size)
            }
            i += 1;
            std::hint::black_box(&buf);
        }
    };
    // Encryption alone on one core, then on all at once.
    let enc = bound::measure(dur, sector_size, || worker(false));
    let dec = rate(dur, sector_size, worker(true));
    Ok(CipherSpeed {
        spec: spec.to_string(),
        key_bits: key_len * 8,
        implementation: c.implementation().to_string(),
        sector_size,
        encrypt_bytes_per_s: enc.one_core,
        decrypt_bytes_per_s: dec,
        encrypt_all_cores_bytes_per_s: enc.all_cores,
        threads: enc.threads,
    })
}

/// Our fastest aes-xts-plain64 encryption+decryption figure for `key_len`-byte keys and
/// 4 KiB sectors, bytes per second (mean of the two directions).
pub fn xts_speed(key_len: usize, dur: Duration) -> Result<CipherSpeed, BenchError> {
    measure("aes-xts-plain64", key_len, CipherImpl::Auto, 4096, dur)
}

/// Parse `openssl speed -evp ... -bytes N` output: the last column of the result line, in
/// thousands of bytes per second ("8668983.96k").
pub fn parse_openssl_speed(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.to_ascii_uppercase().starts_with("AES-"))?;
    let v = line.split_whitespace().last()?;
    let n: f64 = v.strip_suffix('k')?.parse().ok()?;
    Some(n * 1000.0)
}

/// Run `openssl speed -evp aes-256-xts -bytes 8192 -seconds N`.
pub fn openssl_speed(seconds: u32) -> (Option<f64>, String, String) {
    let args = [
        "speed",
        "-evp",
        "aes-256-xts",
        "-bytes",
        "8192",
        "-seconds",
        &seconds.to_string(),
    ];
    let command = format!("openssl {}", args.join(" "));
    let version = Command::new("openssl")
        .arg("version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("unavailable: {e}"));
    let speed = Command::new("openssl")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| parse_openssl_speed(&String::from_utf8_lossy(&o.stdout)));
    (speed, command, version)
}

/// Run the comparison: our implementations for 256- and 512-bit keys at 4 KiB sectors, and
/// `openssl speed` in the same run.
pub fn run(seconds: f64, interrupt: &Interrupt) -> Result<CipherReport, BenchError> {
    let dur = Duration::from_secs_f64(seconds);
    let mut ours = Vec::new();
    let mut imps = vec![CipherImpl::Auto];
    if crate::crypt::cipher::vaes512_available() {
        imps.push(CipherImpl::OpenSsl);
    }
    for imp in imps {
        for key_len in [32, 64] {
            interrupt.check()?;
            ours.push(measure("aes-xts-plain64", key_len, imp, 4096, dur)?);
        }
    }
    interrupt.check()?;
    ours.push(measure("aes-xts-plain64", 64, CipherImpl::Auto, 512, dur)?);
    ours.push(measure(
        "aes-cbc-essiv:sha256",
        32,
        CipherImpl::Auto,
        4096,
        dur,
    )?);
    // The other ciphers volumes use (our modes over RustCrypto's block ciphers).
    for (spec, key_len) in [
        ("serpent-xts-plain64", 64),
        ("twofish-xts-plain64", 64),
        ("serpent-cbc-essiv:sha256", 32),
        ("aes-lrw-benbi", 48),
    ] {
        interrupt.check()?;
        ours.push(measure(spec, key_len, CipherImpl::Auto, 4096, dur)?);
    }
    interrupt.check()?;
    let (speed, command, version) = openssl_speed(seconds.ceil().max(1.0) as u32);
    Ok(CipherReport {
        ours,
        openssl_speed_bytes_per_s: speed,
        openssl_command: command,
        openssl_version: version,
        seconds,
    })
}

fn mb(v: f64) -> String {
    format!("{:.0} MB/s", v / 1e6)
}

/// The report as a table.
pub fn render(r: &CipherReport) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "Cipher throughput, one thread, one call per sector ({:.1} s each; MB = 10^6 bytes);\n\
the last column: the same encryption on every core at once, in total (measured in this run)\n\n",
        r.seconds
    ));
    out.push_str(&format!(
        "{:<24} {:>5} {:>7} {:<12} {:>11} {:>11} {:>9} {:>17}\n",
        "cipher", "key", "sector", "impl", "encrypt", "decrypt", "vs speed", "encrypt all cores"
    ));
    for s in &r.ours {
        let ratio = r
            .openssl_speed_bytes_per_s
            .map(|o| format!("{:.2}", s.encrypt_bytes_per_s / o))
            .unwrap_or_else(|| "-".into());
        let all = match s.threads {
            0 => "-".to_string(),
            t => format!("{} ({t}c)", mb(s.encrypt_all_cores_bytes_per_s)),
        };
        out.push_str(&format!(
            "{:<24} {:>5} {:>7} {:<12} {:>11} {:>11} {:>9} {:>17}\n",
            s.spec,
            s.key_bits,
            s.sector_size,
            s.implementation,
            mb(s.encrypt_bytes_per_s),
            mb(s.decrypt_bytes_per_s),
            ratio,
            all
        ));
    }
    out.push('\n');
    match r.openssl_speed_bytes_per_s {
        Some(o) => out.push_str(&format!(
            "{:<48} {:>11}   ({})\n",
            r.openssl_command,
            mb(o),
            r.openssl_version
        )),
        None => out.push_str(&format!("{}: failed\n", r.openssl_command)),
    }
    if let Some(x) = r.headline_ratio() {
        out.push_str(&format!(
            "ratio aes-xts-plain64 512-bit 4 KiB / openssl speed: {x:.2} (target >= {TARGET:.2}: {})\n",
            if x >= TARGET { "met" } else { "NOT MET" }
        ));
    }
    out
}

crate::bench::harness::report::impl_report!(CipherReport => render);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openssl_speed() {
        let text = "Doing AES-256-XTS for 3s on 8192 size blocks: 3000 AES-256-XTS's in 3.00s\n\
version: 3.0.22\n\
The 'numbers' are in 1000s of bytes per second processed.\n\
type           8192 bytes\n\
AES-256-XTS    8668983.96k\n";
        assert_eq!(parse_openssl_speed(text), Some(8_668_983_960.0));
        assert_eq!(parse_openssl_speed("nothing"), None);
    }
}
