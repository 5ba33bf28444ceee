//! Driving an offline reencryption from a test: the command line of either tool, and a run
//! killed (SIGKILL) once its header says the reencryption is under way.

use super::run::DMKIT_LIMIT;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `program` (cryptsetup, or the dmkit binary) reencrypting `device` offline in batch mode,
/// `tail` (key file, header) and `extra` options given.
pub fn argv(program: &str, tail: &[&str], extra: &[&str], device: &str) -> Vec<String> {
    let head: &[&str] = if program == "cryptsetup" {
        &["reencrypt", "--batch-mode", "--force-offline-reencrypt"]
    } else {
        &["luks", "reencrypt", "--batch-mode"]
    };
    head.iter()
        .chain(tail)
        .chain(extra)
        .chain([&device])
        .map(|s| s.to_string())
        .collect()
}

/// Start `cmd` (its output discarded), wait until `under_way` says the header is in
/// reencryption, then SIGKILL it after `delay`. Returns whether it was still running then
/// (`false` also when it ended before the header was in reencryption).
pub fn kill_when_under_way(
    mut cmd: Command,
    under_way: &dyn Fn() -> bool,
    delay: Duration,
) -> bool {
    let program = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + DMKIT_LIMIT;
    while !under_way() {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(Instant::now() < deadline, "{program} never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(delay);
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    running
}

/// Whether the LUKS2 header at the start of `path` names the reencryption requirement, read
/// from the bytes: a poll while a tool rewrites the header must not run `cryptsetup luksDump`,
/// which fails outright when it reads both copies mid-write.
pub fn header_under_way(path: &str) -> bool {
    std::fs::read(path).is_ok_and(|b| {
        b[..b.len().min(32 << 10)]
            .windows(19)
            .any(|w| w == b"online-reencrypt-v2")
    })
}

/// Open `device_args` (key file, header, device) read-only in dmkit as `name`, read all it
/// serves, close it.
pub fn read_served(e: &super::run::Workspace, device_args: &[&str], name: &str) -> Vec<u8> {
    let mut args = vec!["luks", "open", "--read-only"];
    args.extend(device_args);
    args.push(name);
    let out = e.run.ok(&args);
    let served = std::path::PathBuf::from(out.lines().next().unwrap());
    let back = std::fs::read(&served).unwrap();
    e.run.ok(&["close", name]);
    back
}

/// A workspace holding the passphrase file `key` (with `pass`) and a plaintext image `name`
/// of `size` pseudo-random bytes from `seed`: the workspace, both paths, the plaintext.
pub fn plain_image(
    seed: u64,
    size: usize,
    pass: &str,
    name: &str,
) -> (super::run::Workspace, String, String, Vec<u8>) {
    let e = super::run::Workspace::new();
    let key = e.s("key");
    std::fs::write(&key, pass).unwrap();
    let plain = super::rng::SplitMix64(seed).bytes(size);
    let img = e.s(name);
    std::fs::write(&img, &plain).unwrap();
    (e, key, img, plain)
}

/// `out` of a command that must have succeeded (`what` names it in the failure).
pub fn must(what: &str, out: std::process::Output) -> std::process::Output {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// LUKS2 JSON metadata without what is random (salts, digests, their iterations), to compare
/// what two tools wrote.
pub fn shape(mut m: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    for k in m["keyslots"].as_object_mut().unwrap().values_mut() {
        if let Some(kdf) = k.get_mut("kdf").and_then(Value::as_object_mut) {
            kdf.remove("salt");
        }
    }
    for d in m["digests"].as_object_mut().unwrap().values_mut() {
        let d = d.as_object_mut().unwrap();
        d.remove("salt");
        d.remove("digest");
        d.remove("iterations");
    }
    m
}

/// A device a test reencrypts with either tool, killed mid-run and finished by the other.
pub trait Killable {
    /// Start reencrypting with `program`, SIGKILL it `delay` after the header says the
    /// reencryption is under way; whether it was still running then.
    fn kill(&self, program: &str, delay: Duration) -> bool;
    /// A hotzone was left `in-reencryption`.
    fn crashed(&self) -> bool;
    /// Finish with `program` whatever is left.
    fn finish(&self, program: &str);
    /// The reencryption is complete and the data right (`what` names the case).
    fn check(&self, what: &str);
}

/// Each tool killed three times at a random delay below `max_ms` (from `seed`) and the other
/// finishing, a fresh device `make(round)` each time.
pub fn killed_both_ways<D: Killable>(seed: u64, max_ms: u64, make: impl Fn(u64) -> D) {
    let mut rng = super::rng::SplitMix64(seed);
    for (first, then) in [(super::DMKIT, "cryptsetup"), ("cryptsetup", super::DMKIT)] {
        for round in 0..3 {
            let d = make(round);
            let delay = Duration::from_millis(rng.below(max_ms));
            let running = d.kill(first, delay);
            let what = format!(
                "{first} killed after {delay:?} (running: {running}, crashed hotzone: {})",
                d.crashed()
            );
            eprintln!("{what}");
            d.finish(then);
            d.check(&what);
        }
    }
}

/// The command line of `program` (dmkit or cryptsetup) reencrypting `device` offline with
/// `tail` (key and header options) and `extra`, run in `dir` (cryptsetup makes its temporary
/// header file in the current directory), without a terminal.
pub fn offline_command(
    program: &str,
    tail: &[&str],
    extra: &[&str],
    device: &str,
    dir: &std::path::Path,
) -> Command {
    let mut c = Command::new(program);
    c.args(argv(program, tail, extra, device))
        .current_dir(dir)
        .stdin(Stdio::null());
    c
}

/// Run `cmd` to success ([`must`]), naming it by `program` and `extra`.
pub fn run_must(program: &str, extra: &[&str], mut cmd: Command) {
    must(&format!("{program} {extra:?}"), cmd.output().unwrap());
}

/// The writes and flushes of `run` (a reencryption run to its end) on a fault-injection device
/// holding `base`, for [`dmkit::block::for_each_crash_state`], and how many writes they hold.
pub fn logged_run(
    base: &[u8],
    run: impl Fn(&dyn dmkit::block::BlockDevice) -> dmkit::crypt::luks2::reencrypt::RunOutcome,
) -> (Vec<dmkit::block::LoggedOp>, usize) {
    use dmkit::block::{FaultyDevice, LoggedOp, MemoryDevice};
    let faulty = FaultyDevice::new(MemoryDevice::from_vec("logged", base.to_vec()));
    faulty.start_log();
    assert_eq!(
        run(&faulty),
        dmkit::crypt::luks2::reencrypt::RunOutcome::Finished
    );
    let log = faulty.take_log();
    let writes = log
        .iter()
        .filter(|o| matches!(o, LoggedOp::Write { .. }))
        .count();
    (log, writes)
}

/// Resume, as `luks reencrypt --resume-only` does (hotzones of at most `hotzone` bytes), the
/// re-key, encryption or decryption without a data shift whose header is on `hdr` and data on
/// `data` (the same device when the header is attached): a run cryptsetup left in its
/// teardown is only finished, anything else has both keys unlocked with `pass` and runs to
/// its end.
pub fn resume_in_place(
    hdr: &dyn dmkit::block::BlockDevice,
    data: &dyn dmkit::block::BlockDevice,
    pass: &[u8],
    hotzone: u64,
) -> Result<dmkit::crypt::luks2::reencrypt::RunOutcome, dmkit::crypt::luks::LuksError> {
    resume_gated(hdr, data, pass, hotzone, None)
}

/// [`resume_in_place`], telling `hooks` of every hotzone as an online run tells its server.
pub fn resume_gated(
    hdr: &dyn dmkit::block::BlockDevice,
    data: &dyn dmkit::block::BlockDevice,
    pass: &[u8],
    hotzone: u64,
    hooks: Option<&dyn dmkit::crypt::luks2::reencrypt::engine::Hotzones>,
) -> Result<dmkit::crypt::luks2::reencrypt::RunOutcome, dmkit::crypt::luks::LuksError> {
    use dmkit::crypt::luks2::reencrypt::{engine, ReencryptState, RunOptions, RunOutcome};
    let mut h = dmkit::crypt::luks2::copies::read(hdr)?.header;
    let st = ReencryptState::read(&h.metadata)?.expect("a reencryption to resume");
    if engine::finish_orphaned(hdr, &mut h, &st, pass, None)? {
        return Ok(RunOutcome::Finished);
    }
    let keys = engine::unlock_keys(hdr, &h, &st, pass, None)?;
    let opts = RunOptions {
        max_hotzone: Some(hotzone),
        io_block: 4096,
        device_size: None,
    };
    let run = engine::Run::new(hdr, data, &mut h, &keys)?;
    match hooks {
        Some(hooks) => run.run_gated(hooks, &opts, &mut |_| true),
        None => run.run(&opts, &mut |_| true),
    }
}

/// `cmd` (a `--resume-only` of a device not in reencryption) refuses with exit 1 and says
/// the reencryption is not in progress (`what` names the case).
pub fn not_in_progress(cmd: Command, what: &str) {
    refuses(cmd, "not in progress", what)
}

/// `cmd` refuses with exit 1 and a message that contains `says` (`what` names the case).
pub fn refuses(mut cmd: Command, says: &str, what: &str) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(err.contains(says), "{what}: {err}");
}
