//! What the report says about the machine: CPU, flags, memory, kernel, tool versions, load,
//! and which of the kernel's own targets the running kernel has.

use std::path::Path;

use super::model::{KernelTarget, Machine};
use crate::bench::harness::process::Dmkit;
use crate::bench::harness::tools::tool_version;

/// The CPU flags worth naming for these layers (the rest are counted).
const FLAGS: [&str; 9] = [
    "aes",
    "pclmulqdq",
    "avx",
    "avx2",
    "avx512f",
    "vaes",
    "vpclmulqdq",
    "sha_ni",
    "sse4_2",
];

/// Tools whose version goes into the report (`--version`'s first line).
const TOOLS: [&str; 7] = [
    "fio",
    "cryptsetup",
    "veritysetup",
    "integritysetup",
    "mksquashfs",
    "mkfs.erofs",
    "fsverity",
];

fn read(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The machine, now.
pub fn machine() -> Machine {
    let cpuinfo = read("/proc/cpuinfo");
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let all: Vec<String> = field("flags")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut cpu_flags: Vec<String> = FLAGS
        .iter()
        .filter(|f| all.iter().any(|a| a == *f))
        .map(|f| f.to_string())
        .collect();
    cpu_flags.push(format!("({} flags in all)", all.len()));
    let memory = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let uname = format!(
        "{} {} {} {}",
        read("/proc/sys/kernel/ostype").trim(),
        read("/proc/sys/kernel/hostname").trim(),
        kernel,
        read("/proc/sys/kernel/version").trim()
    );
    let mut tools: Vec<(String, String)> = TOOLS
        .iter()
        .map(|t| {
            let v = match *t {
                "mksquashfs" => first_line_of(t, "-version"),
                "mkfs.erofs" => first_line_of(t, "-V"),
                _ => tool_version(t),
            };
            (
                t.to_string(),
                if v.is_empty() {
                    "not installed".into()
                } else {
                    v
                },
            )
        })
        .collect();
    tools.push(("openssl".into(), first_line_of("openssl", "version")));
    Machine {
        uname,
        kernel,
        cpu: field("model name"),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_flags,
        memory,
        tools,
        dmkit_build: Dmkit::from_env()
            .map(|d| d.build_label())
            .unwrap_or_else(|e| e.to_string()),
    }
}

fn first_line_of(prog: &str, arg: &str) -> String {
    std::process::Command::new(prog)
        .arg(arg)
        .stdin(std::process::Stdio::null())
        .output()
        .map(|o| {
            let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
            t.push_str(&String::from_utf8_lossy(&o.stderr));
            t.lines().next().unwrap_or("").trim().to_string()
        })
        .unwrap_or_default()
}

/// The load average now (1, 5, 15 minutes).
pub fn load_average() -> [f64; 3] {
    let s = read("/proc/loadavg");
    let mut it = s.split_whitespace().map(|v| v.parse().unwrap_or(0.0));
    [
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
    ]
}

/// Whether a kernel module or built-in feature is there: `/sys/module/NAME`, or the symbol
/// prefix in `/proc/kallsyms` for built-ins (which have no /sys/module entry without
/// parameters).
fn has_module(name: &str, symbol: &str) -> bool {
    Path::new("/sys/module").join(name).exists()
        || read("/proc/kallsyms")
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(symbol))
}

/// The kernel's targets the documents measured, and what the report does with them. dmkit's
/// rows run in userspace on every kernel; the kernel's own targets are not driven by this
/// version of the bench (they need root, a device-mapper kernel and a disk image per side),
/// so their column is always a reason: which one depends on what the kernel has.
pub fn kernel_targets() -> Vec<KernelTarget> {
    // /proc/misc, not /dev/mapper/control: a node left in /dev opens with ENODEV on a kernel
    // without device-mapper.
    let dm = read("/proc/misc")
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("device-mapper"));
    let probe = |target: &str, module: &str, symbol: &str| {
        let available = dm && has_module(module, symbol);
        let note = if !dm {
            format!("the running kernel has no device-mapper (none in /proc/misc), so no {target}: kernel column not run")
        } else if !available {
            format!("the running kernel has no {target} ({module} not loaded or built in): kernel column not run")
        } else {
            format!("the running kernel has {target}, but this version of bench seeds does not drive kernel targets: kernel column not run")
        };
        KernelTarget {
            target: target.into(),
            available,
            note,
        }
    };
    let fsv = read("/proc/kallsyms")
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("fsverity_ioctl_enable"));
    vec![
        probe("dm-verity", "dm_verity", "verity_map"),
        probe("dm-integrity", "dm_integrity", "dm_integrity_map"),
        probe("dm-crypt", "dm_crypt", "crypt_map"),
        KernelTarget {
            target: "fs-verity".into(),
            available: fsv,
            note: if fsv {
                "the running kernel has fs-verity, but this version of bench seeds does not drive it: kernel column not run".into()
            } else {
                "the running kernel has no fs-verity: kernel column not run".into()
            },
        },
    ]
}

/// The note of `target` among `targets` (for a row's kernel column).
pub fn kernel_note(targets: &[KernelTarget], target: &str) -> String {
    targets
        .iter()
        .find(|t| t.target == target)
        .map_or_else(|| "no kernel counterpart".into(), |t| t.note.clone())
}
