//! How FUSE requests reach the server: the classic `/dev/fuse` read/write threads, or FUSE over
//! io_uring (kernel 6.14 and later, when `/sys/module/fuse/parameters/enable_uring` is on).
//!
//! The choice is the user's (`DMKIT_FUSE_TRANSPORT`, default `auto`); what is in use is decided
//! at INIT, when the kernel says whether it offers the ring, and is what `status` shows.

use std::fmt;
use std::io;
use std::path::Path;

/// The environment variable that picks the transport of every FUSE export a server mounts.
pub const TRANSPORT_ENV: &str = "DMKIT_FUSE_TRANSPORT";

/// The kernel module's switch for FUSE over io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Which transport the user asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// io_uring when the kernel offers it and the rings can be set up, else `/dev/fuse`.
    #[default]
    Auto,
    /// Always the `/dev/fuse` threads.
    DevFuse,
    /// io_uring or nothing: the mount fails when the ring cannot be used.
    IoUring,
}

impl TransportChoice {
    /// Parse a value of [`TRANSPORT_ENV`]: `auto`, `dev-fuse` or `io-uring`.
    pub fn parse(s: &str) -> Result<TransportChoice, String> {
        match s.trim() {
            "" | "auto" => Ok(TransportChoice::Auto),
            "dev-fuse" | "/dev/fuse" => Ok(TransportChoice::DevFuse),
            "io-uring" | "io_uring" | "uring" => Ok(TransportChoice::IoUring),
            other => Err(format!(
                "{TRANSPORT_ENV}: unknown transport {other:?} (auto, dev-fuse or io-uring)"
            )),
        }
    }

    /// The choice [`TRANSPORT_ENV`] makes (`auto` when unset).
    pub fn from_env() -> Result<TransportChoice, String> {
        match std::env::var(TRANSPORT_ENV) {
            Ok(v) => TransportChoice::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(TransportChoice::Auto),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(format!("{TRANSPORT_ENV}: the value is not UTF-8"))
            }
        }
    }
}

/// The transport a mount serves through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// `/dev/fuse` read/write on this many threads; `why` says why not io_uring (when it was
    /// not asked away).
    DevFuse {
        /// Serving threads.
        threads: usize,
        /// Why io_uring is not in use, when the choice was `auto`.
        why: Option<String>,
    },
    /// FUSE over io_uring: one ring queue per possible CPU, each served by a thread pinned to
    /// that CPU.
    IoUring {
        /// Ring queues (the kernel's: one per possible CPU).
        queues: usize,
        /// Ring entries (requests in flight) per queue.
        depth: usize,
    },
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::DevFuse { threads, .. } => write!(
                f,
                "/dev/fuse ({threads} thread{})",
                if *threads == 1 { "" } else { "s" }
            ),
            Transport::IoUring { queues, .. } => write!(
                f,
                "io-uring ({queues} queue{})",
                if *queues == 1 { "" } else { "s" }
            ),
        }
    }
}

/// Whether the kernel's switch is on (`None` when this kernel has no such switch).
pub fn uring_switch() -> Option<bool> {
    let v = std::fs::read_to_string(ENABLE_URING).ok()?;
    Some(matches!(v.trim(), "Y" | "y" | "1"))
}

/// Why io_uring was not offered at INIT, in words a user can act on.
pub(super) fn not_offered() -> String {
    match uring_switch() {
        Some(false) => format!(
            "the kernel does not offer FUSE over io_uring: {ENABLE_URING} is off \
             (echo Y > {ENABLE_URING})"
        ),
        Some(true) => "the kernel did not offer FUSE over io_uring at INIT".to_string(),
        None => format!("this kernel has no FUSE over io_uring ({ENABLE_URING} is missing)"),
    }
}

/// The number of possible CPUs: the kernel makes one ring queue per possible CPU and refuses
/// to use the ring until each has an entry.
pub(super) fn possible_cpus() -> io::Result<usize> {
    let p = Path::new("/sys/devices/system/cpu/possible");
    let text = std::fs::read_to_string(p)?;
    count_cpu_list(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: cannot parse {:?}", p.display(), text.trim()),
        )
    })
}

/// The number of CPUs in a kernel CPU list (`0-3,5,7-8`).
fn count_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        if b < a {
            return None;
        }
        n = n.checked_add(b - a + 1)?;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!(TransportChoice::parse("auto"), Ok(TransportChoice::Auto));
        assert_eq!(TransportChoice::parse(""), Ok(TransportChoice::Auto));
        assert_eq!(
            TransportChoice::parse("io-uring"),
            Ok(TransportChoice::IoUring)
        );
        assert_eq!(
            TransportChoice::parse("dev-fuse"),
            Ok(TransportChoice::DevFuse)
        );
        let e = TransportChoice::parse("rdma").unwrap_err();
        assert!(e.contains(TRANSPORT_ENV) && e.contains("rdma"), "{e}");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,5,7-8"), Some(7));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
        assert!(possible_cpus().unwrap() >= 1);
    }

    #[test]
    fn shown_as_status_says() {
        let t = Transport::IoUring {
            queues: 2,
            depth: 8,
        };
        assert_eq!(t.to_string(), "io-uring (2 queues)");
        let t = Transport::DevFuse {
            threads: 4,
            why: None,
        };
        assert_eq!(t.to_string(), "/dev/fuse (4 threads)");
    }
}
