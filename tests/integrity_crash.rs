//! A dm-integrity device survives `kill -9` of its server at a random moment, in every mode
//! (J, B, D), with 512- and 4096-byte sectors, opened in the background (the forked daemon)
//! and in the foreground: a writer does fsync'd writes through the export while the server is
//! killed; then `dmkit close` cleans up, `integritysetup dump` accepts the image, and the
//! device reopens in the same mode without `--integrity-recovery-mode`, every write whose
//! fsync returned intact (a write in flight at the kill may have landed, sector by sector, or
//! not). Mode D has no crash guarantee, in the kernel as here: a torn write leaves data and tag
//! apart, so for D only the reopen and the dump are checked.
//!
//! `DMKIT_CRASH_CYCLES` sets the kills per mode, sector size and way of opening: default 20,
//! the acceptance count (240 kills in all), 53 s for the file on a release build on 2
//! busy cores;
//! `DMKIT_CRASH_SEED` replays a run (each test prints its seed).
//!
//! Needs root and /dev/fuse, and integritysetup: missing ones fail the test when `CI` is set
//! and skip it otherwise.

mod common;

use common::env::{fuse_missing, tools_missing};
use common::rng::{env_seed, time_seed, SplitMix64};
use common::run::{Run, Workspace};
use common::sys::{aligned, kill, pid_gone, wait_until};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SIZE: u64 = 16 << 20;
const SECTOR: usize = 512;
/// Writes are whole, aligned 4 KiB blocks (any sector size takes them), 1 to 8 at a time.
const BLOCK: u64 = 4096;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Journal,
    Bitmap,
    Direct,
}

impl Mode {
    fn args(self) -> &'static [&'static str] {
        match self {
            Mode::Journal => &[],
            Mode::Bitmap => &["--integrity-bitmap-mode"],
            Mode::Direct => &["--integrity-no-journal"],
        }
    }
}

fn cycles() -> u32 {
    std::env::var("DMKIT_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// The 512 bytes that write `id` puts in device sector `sector`: every write's every sector
/// is different, so a read tells which write it came from.
fn content(id: u64, sector: u64) -> Vec<u8> {
    SplitMix64(id << 32 | sector).bytes(SECTOR)
}

/// What each sector must hold: the last write whose fsync returned (`None`: zeros, as the
/// format left it), or else the write that was in flight at the kill.
struct Model {
    acked: Vec<Option<u64>>,
    pending: Vec<Option<u64>>,
}

impl Model {
    fn new(sectors: usize) -> Model {
        Model {
            acked: vec![None; sectors],
            pending: vec![None; sectors],
        }
    }

    fn expected(&self, id: Option<u64>, s: usize) -> Vec<u8> {
        id.map_or_else(|| vec![0; SECTOR], |id| content(id, s as u64))
    }

    /// Check `got` (the whole device) and settle each in-flight sector on what it holds.
    fn check(&mut self, got: &[u8], what: &str) {
        for s in 0..self.acked.len() {
            let have = &got[s * SECTOR..(s + 1) * SECTOR];
            let old = self.expected(self.acked[s], s);
            if have == &old[..] {
                self.pending[s] = None;
                continue;
            }
            let new = self.pending[s].map(|id| self.expected(Some(id), s));
            assert!(
                new.as_deref() == Some(have),
                "{what}: sector {s} holds neither its last fsync'd write ({:?}) nor the one \
                 in flight ({:?})",
                self.acked[s],
                self.pending[s]
            );
            self.acked[s] = self.pending[s].take();
        }
    }
}

/// A served device: its exported file and the server's pid (and the process itself when it
/// runs in the foreground, a child of the test).
struct Served {
    path: String,
    pid: u32,
    child: Option<Child>,
}

fn open(ws: &Workspace, img: &str, mode: Mode, foreground: bool, what: &str) -> Served {
    let mut args = vec!["integrity", "open", img, "ic"];
    args.extend_from_slice(mode.args());
    if !foreground {
        let r: Run = ws.run.run(&args);
        assert_eq!(r.code, Some(0), "{what}: reopen failed:\n{}", r.describe());
        ws.run.track("ic");
        let st = ws.run.ok(&["status", "ic", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&st).unwrap();
        return Served {
            path: r.stdout.lines().next().unwrap().to_string(),
            pid: v["pid"].as_u64().unwrap() as u32,
            child: None,
        };
    }
    args.push("--foreground");
    let log = std::fs::File::create(ws.path("fg.log")).unwrap();
    let mut child = Command::new(common::DMKIT)
        .args(&args)
        .env("DMKIT_RUN_DIR", ws.run.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    ws.run.track("ic");
    let mut line = String::new();
    let n = BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if n == 0 {
        let status = child.wait().unwrap();
        let log = std::fs::read_to_string(ws.path("fg.log")).unwrap_or_default();
        panic!("{what}: foreground open failed ({status}): {log}");
    }
    Served {
        path: line.trim().to_string(),
        pid: child.id(),
        child: Some(child),
    }
}

/// The writer: random fsync'd writes until the export fails (the server is dead). Each write
/// is recorded in flight before it starts and acknowledged once its fsync returned.
fn writer(path: &str, seed: u64, ids: u64, model: &Mutex<Model>, stop: &AtomicBool) -> u64 {
    // The kill may come first: then there is nothing to open, and nothing was written.
    let Ok(f) = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    else {
        return ids;
    };
    let Ok(meta) = f.metadata() else { return ids };
    let blocks = meta.len() / BLOCK;
    let mut rng = SplitMix64(seed);
    let (mut v, off) = aligned(8 * BLOCK as usize);
    let mut id = ids;
    while !stop.load(Ordering::Relaxed) {
        let n = 1 + rng.below(8);
        let at = rng.below(blocks - n + 1) * BLOCK;
        let s0 = (at as usize) / SECTOR;
        let ns = (n * BLOCK) as usize / SECTOR;
        let buf = &mut v[off..off + ns * SECTOR];
        for k in 0..ns {
            buf[k * SECTOR..(k + 1) * SECTOR].copy_from_slice(&content(id, (s0 + k) as u64));
        }
        {
            let mut m = model.lock().unwrap();
            for p in &mut m.pending[s0..s0 + ns] {
                *p = Some(id);
            }
        }
        if f.write_all_at(buf, at).is_err() || f.sync_data().is_err() {
            break;
        }
        let mut m = model.lock().unwrap();
        for s in s0..s0 + ns {
            m.acked[s] = m.pending[s].take();
        }
        id += 1;
    }
    id
}

/// Read the whole device through its export and check it against the model.
fn check_contents(served: &Served, model: &Mutex<Model>, what: &str) {
    let f = std::fs::File::open(&served.path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let mut got = vec![0u8; len];
    f.read_exact_at(&mut got, 0)
        .unwrap_or_else(|e| panic!("{what}: reading the reopened device: {e}"));
    model.lock().unwrap().check(&got, what);
}

fn dump_accepts(img: &str, what: &str) {
    let r = common::run::text("integritysetup", &["dump", img]);
    assert_eq!(
        r.code,
        Some(0),
        "{what}: integritysetup dump refuses the image:\n{}",
        r.describe()
    );
}

/// `cycles()` kills of a device of `mode` with `sector_size`-byte sectors, opened in the
/// background or the foreground; returns how many fsync'd writes were checked.
fn crash_loop(mode: Mode, sector_size: u32, foreground: bool, seed: u64) -> u64 {
    let ws = Workspace::new();
    let img = ws.sparse("img", SIZE);
    let ss = sector_size.to_string();
    ws.run.ok(&[
        "integrity",
        "format",
        "--batch-mode",
        "--sector-size",
        &ss,
        &img,
    ]);
    let mut rng = SplitMix64(seed);
    // Sized at the first open, to the device the format provides.
    let model = Arc::new(Mutex::new(Model::new(0)));
    let mut next_id = 1u64;
    let checked = mode != Mode::Direct;
    for cycle in 0..=cycles() {
        let what = format!(
            "mode {mode:?}, {sector_size}-byte sectors, {}, cycle {cycle}, seed {seed}",
            if foreground {
                "foreground"
            } else {
                "background"
            }
        );
        let served = open(&ws, &img, mode, foreground, &what);
        if cycle == 0 {
            let len = std::fs::metadata(&served.path).unwrap().len() as usize;
            *model.lock().unwrap() = Model::new(len / SECTOR);
        }
        if checked {
            check_contents(&served, &model, &what);
        }
        if cycle == cycles() {
            // The last round: a clean close leaves an image that opens and dumps too.
            if let Some(mut c) = served.child {
                ws.run.close("ic");
                c.wait().unwrap();
            } else {
                ws.run.close("ic");
            }
            dump_accepts(&img, &what);
            break;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (m, st, p, wseed, first) = (
            model.clone(),
            stop.clone(),
            served.path.clone(),
            rng.next(),
            next_id,
        );
        let w = std::thread::spawn(move || writer(&p, wseed, first, &m, &st));
        // Kill at a random moment: often mid-write, sometimes before the first write is done.
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        kill(served.pid, libc::SIGKILL);
        let mut child = served.child;
        if let Some(c) = &mut child {
            c.wait().unwrap();
        }
        wait_until("the server's death", || pid_gone(served.pid));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !w.is_finished() {
            assert!(Instant::now() < deadline, "{what}: the writer hangs");
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        next_id = w.join().unwrap();
        // The dead server's leftovers go; then the image is as the crash left it.
        ws.run.ok(&["close", "ic"]);
        dump_accepts(&img, &what);
    }
    if checked {
        next_id - 1
    } else {
        0
    }
}

fn run_mode(mode: Mode) {
    if fuse_missing() || tools_missing(&[("integritysetup", "cryptsetup-bin")]) {
        return;
    }
    let seed = env_seed("DMKIT_CRASH_SEED").unwrap_or_else(time_seed);
    eprintln!(
        "{mode:?}: seed {seed} (DMKIT_CRASH_SEED replays it), {} cycles",
        cycles()
    );
    let t = Instant::now();
    for sector_size in [512, 4096] {
        for foreground in [false, true] {
            let s = seed ^ u64::from(sector_size) ^ u64::from(foreground);
            let n = crash_loop(mode, sector_size, foreground, s);
            eprintln!(
                "{mode:?}, {sector_size}-byte sectors, {}: {} kill -9 cycles, {n} fsync'd writes checked",
                if foreground { "foreground" } else { "background" },
                cycles()
            );
        }
    }
    eprintln!("{mode:?}: {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn journal_mode_keeps_every_fsynced_write_across_kill_9() {
    run_mode(Mode::Journal);
}

#[test]
fn bitmap_mode_keeps_every_fsynced_write_across_kill_9() {
    run_mode(Mode::Bitmap);
}

/// Mode D promises nothing after a crash (the kernel's neither): it must only reopen and
/// dump.
#[test]
fn direct_mode_reopens_after_kill_9() {
    run_mode(Mode::Direct);
}
