//! What the speed examples share: MiB/s, and the disk's own write speed as their baseline.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// `bytes` in `secs`, in MiB/s.
pub fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / (1 << 20) as f64
}

/// `dd if=/dev/zero bs=1M oflag=direct` writing `mib` MiB to `DIR/dd.img` (deleted after):
/// the storage's sequential write speed, in MiB/s.
pub fn dd_direct(dir: &Path, mib: u64) -> f64 {
    let img = dir.join("dd.img");
    let _ = std::fs::remove_file(&img);
    let t = Instant::now();
    let st = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "oflag=direct", "status=none"])
        .arg(format!("of={}", img.display()))
        .arg(format!("count={mib}"))
        .status()
        .expect("dd");
    assert!(st.success(), "dd failed");
    let v = mib_s(mib << 20, t.elapsed().as_secs_f64());
    let _ = std::fs::remove_file(&img);
    v
}
