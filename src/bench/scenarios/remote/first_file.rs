//! Time to first file (issue 28): from starting `dmkit image cat URL PATH` to the first bytes
//! of the file on its stdout, and to its last byte, against the same command on the local
//! image file. The image is a signed root image made by `dmkit image build`, served by the
//! bench's own HTTP server with its delay per request; every remote run starts with no cache
//! (`--no-cache`), so it reads the partition table, the signature, the whole hash tree and the
//! file's blocks over the network, each verified.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::server::RangeServer;
use crate::bench::harness::model::Stats;
use crate::bench::harness::process::{Dmkit, Interrupt};
use crate::bench::BenchError;

/// The file read: large enough to need several fetches, small enough for a quick run.
const FILE_BYTES: usize = 4 << 20;

/// One delay's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstFileCell {
    /// Delay per request, ms.
    pub delay_ms: u64,
    /// Local image: seconds to the first byte, per run.
    pub local_first_s: Vec<f64>,
    /// Local image: seconds to the whole file, per run.
    pub local_all_s: Vec<f64>,
    /// Remote image: seconds to the first byte, per run.
    pub remote_first_s: Vec<f64>,
    /// Remote image: seconds to the whole file, per run.
    pub remote_all_s: Vec<f64>,
    /// HTTP requests of the last remote run.
    pub http_requests: u64,
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        what: what.to_string(),
        source,
    }
}

/// Build the image in `scratch` and measure `runs` runs at each delay.
pub fn run(
    dmkit: &Dmkit,
    scratch: &Path,
    delays_ms: &[u64],
    runs: u32,
    interrupt: &Interrupt,
) -> Result<Vec<FirstFileCell>, BenchError> {
    let tree = scratch.join("ff-tree");
    std::fs::create_dir_all(tree.join("etc")).map_err(io("create the tree"))?;
    std::fs::write(tree.join("etc/hostname"), b"bench\n").map_err(io("write the tree"))?;
    let mut bytes = vec![0u8; FILE_BYTES];
    let mut x = 0x2828_2828u64;
    for b in bytes.iter_mut() {
        // xorshift: data the file system cannot compress away.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(tree.join("first.bin"), &bytes).map_err(io("write the tree"))?;
    let image = scratch.join("ff-root.raw");
    let out = dmkit
        .command(["image", "build", "--timestamp", "1700000000"])
        .arg(&tree)
        .arg(&image)
        .output()
        .map_err(io("run dmkit image build"))?;
    if !out.status.success() {
        return Err(BenchError::Invalid(format!(
            "dmkit image build: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let srv = RangeServer::start(&[("/root.raw".into(), image.clone())], Duration::ZERO)
        .map_err(io("start the HTTP server"))?;
    let url = format!("{}/root.raw", srv.base_url());
    let local = image.to_string_lossy().into_owned();
    let mut cells = Vec::new();
    for &delay in delays_ms {
        srv.set_delay(Duration::from_millis(delay));
        let mut c = FirstFileCell {
            delay_ms: delay,
            local_first_s: Vec::new(),
            local_all_s: Vec::new(),
            remote_first_s: Vec::new(),
            remote_all_s: Vec::new(),
            http_requests: 0,
        };
        for _ in 0..runs {
            interrupt.check()?;
            let (f, a) = cat(dmkit, &local, &[])?;
            c.local_first_s.push(f);
            c.local_all_s.push(a);
            let before = srv.counters().0;
            let (f, a) = cat(dmkit, &url, &["--no-cache"])?;
            c.http_requests = srv.counters().0 - before;
            c.remote_first_s.push(f);
            c.remote_all_s.push(a);
        }
        cells.push(c);
    }
    Ok(cells)
}

/// `dmkit image cat [OPTS] IMAGE /first.bin`: seconds to its first byte and to its last, the
/// bytes checked for their count.
fn cat(dmkit: &Dmkit, image: &str, opts: &[&str]) -> Result<(f64, f64), BenchError> {
    let t = Instant::now();
    let mut child = dmkit
        .command(["image", "cat"])
        .args(opts)
        .args([image, "/first.bin"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io("run dmkit image cat"))?;
    let mut out = child.stdout.take().expect("piped");
    let mut buf = vec![0u8; 1 << 16];
    let mut first = None;
    let mut total = 0usize;
    loop {
        let n = out.read(&mut buf).map_err(io("read dmkit image cat"))?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| t.elapsed().as_secs_f64());
        total += n;
    }
    let all = t.elapsed().as_secs_f64();
    let o = child
        .wait_with_output()
        .map_err(io("wait for dmkit image cat"))?;
    if !o.status.success() || total != FILE_BYTES {
        return Err(BenchError::Invalid(format!(
            "dmkit image cat {image} /first.bin: {} bytes, {}: {}",
            total,
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    Ok((first.unwrap_or(all), all))
}

fn median(v: &[f64]) -> String {
    Stats::of(v).map_or("-".into(), |s| format!("{:.3} s", s.median))
}

/// The table: medians per delay.
pub fn render(cells: &[FirstFileCell]) -> String {
    if cells.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\nTime to first file: `dmkit image cat IMAGE /first.bin` ({} MiB) of a signed root \
         image, from start to its first byte / last byte (median; remote: --no-cache, every \
         block verified)\n",
        FILE_BYTES >> 20
    );
    s.push_str(&format!(
        "{:>6}  {:>19}  {:>19}  {:>13}\n",
        "delay", "local first / all", "remote first / all", "HTTP requests"
    ));
    for c in cells {
        s.push_str(&format!(
            "{:>3} ms  {:>9} / {:>7}  {:>9} / {:>7}  {:>13}\n",
            c.delay_ms,
            median(&c.local_first_s),
            median(&c.local_all_s),
            median(&c.remote_first_s),
            median(&c.remote_all_s),
            c.http_requests
        ));
    }
    s
}
