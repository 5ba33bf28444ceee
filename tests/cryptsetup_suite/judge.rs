//! One image judged by cryptsetup (the oracle, run in the same test) and by dmkit: header
//! accepted or refused by `luksDump`, the dump text, each passphrase's `test-passphrase`
//! exit code, and the volume key. Each tool works on its own copy (cryptsetup rewrites a
//! damaged header copy as it reads); dmkit's copy must not change by a single byte.

use crate::common::{run, DMKIT};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A passphrase as the scripts give it (`echo $PWD | cryptsetup ...`: the line without its
/// newline), or a key file.
#[derive(Clone)]
pub enum Secret {
    Pass(&'static str),
    File(PathBuf),
}

/// One `open --test-passphrase` the scripts do, and what they expect of it when they say.
#[derive(Clone)]
pub struct Unlock {
    pub secret: Secret,
    pub slot: Option<u32>,
    /// `--unbound`: keys of keyslots bound to no segment count too.
    pub unbound: bool,
    /// The script's expectation: success or failure (`None`: the script does not say).
    pub script: Option<bool>,
}

/// An image and what to ask about it.
pub struct Case {
    pub group: &'static str,
    pub image: PathBuf,
    /// Whether the script expects `luksDump` to accept it, when it says.
    pub script_dump: Option<bool>,
    pub unlocks: Vec<Unlock>,
}

impl Case {
    pub fn name(&self) -> String {
        self.image
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }
}

/// Verdict counts of one group.
#[derive(Default)]
pub struct Row {
    pub images: usize,
    pub is_luks_same: usize,
    pub both_accept: usize,
    pub both_refuse: usize,
    pub dump_same: usize,
    pub unlocks_same: usize,
    pub unlocks: usize,
    pub keys_same: usize,
    /// Images where cryptsetup opens with a passphrase its script calls wrong.
    pub cryptsetup_broken: usize,
    /// Unlocks cryptsetup cannot judge without device-mapper (its userspace crypto lacks the
    /// keyslot's cipher, so it would decrypt through a temporary dm-crypt mapping): dmkit
    /// must then give the script's expected result.
    pub by_script: usize,
    pub differ: usize,
}

/// What all judged cases came to.
#[derive(Default)]
pub struct Tally {
    pub rows: BTreeMap<&'static str, Row>,
    /// Disagreements (each a line saying what and where).
    pub unexpected: Vec<String>,
}

impl Tally {
    /// The summary table.
    pub fn table(&self) -> String {
        let mut t = format!(
            "{:<40} {:>6} {:>8} {:>7} {:>7} {:>6} {:>9} {:>6} {:>7} {:>9} {:>6}\n",
            "group",
            "images",
            "isLuks=",
            "accept",
            "refuse",
            "dump=",
            "unlock=",
            "vk=",
            "cs-bug",
            "by-script",
            "differ"
        );
        for (g, r) in &self.rows {
            t += &format!(
                "{:<40} {:>6} {:>8} {:>7} {:>7} {:>6} {:>5}/{:<3} {:>6} {:>7} {:>9} {:>6}\n",
                g,
                r.images,
                r.is_luks_same,
                r.both_accept,
                r.both_refuse,
                r.dump_same,
                r.unlocks_same,
                r.unlocks,
                r.keys_same,
                r.cryptsetup_broken,
                r.by_script,
                r.differ
            );
        }
        t
    }

    fn differ(&mut self, case: &Case, what: String) {
        let name = case.name();
        self.rows.entry(case.group).or_default().differ += 1;
        self.unexpected
            .push(format!("{}: {name}: {what}", case.group));
    }
}

/// The text minus the line naming the device, which differs only in spelling.
fn comparable(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in text.split_inclusive(|&c| c == b'\n') {
        if !l.starts_with(b"LUKS header information for") {
            out.extend_from_slice(l);
        }
    }
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// (exit code, stdout) of a command.
fn run_tool(program: &str, args: &[&str]) -> (i32, Vec<u8>) {
    let out = run::output(program, args);
    (out.status.code().unwrap_or(-1), out.stdout)
}

fn copy(from: &Path, to: &Path) {
    let _ = std::fs::remove_file(to);
    run::ok("cp", &["--sparse=always", s(from), s(to)]);
}

/// Judge `case` in the scratch directory `work`, adding to `tally`.
pub fn judge(case: &Case, work: &Path, tally: &mut Tally) {
    let cs_img = work.join("cs.img");
    let dm_img = work.join("dm.img");
    copy(&case.image, &cs_img);
    copy(&case.image, &dm_img);
    judge_copies(case, &cs_img, &dm_img, work, tally);
}

/// Judge `case` on copies of its image already made: `cs_img` for cryptsetup, `dm_img` for
/// dmkit.
pub fn judge_copies(case: &Case, cs_img: &Path, dm_img: &Path, work: &Path, tally: &mut Tally) {
    let (cs_img, dm_img) = (cs_img.to_path_buf(), dm_img.to_path_buf());
    let untouched = std::fs::read(&dm_img).unwrap();
    tally.rows.entry(case.group).or_default().images += 1;

    // isLuks -v: the same exit code and the same verdict line.
    let (cs_code, cs_says) = run_tool("cryptsetup", &["isLuks", "-v", s(&cs_img)]);
    let (dm_code, dm_says) = run_tool(DMKIT, &["isLuks", "-v", s(&dm_img)]);
    if (cs_code, &cs_says) == (dm_code, &dm_says) {
        tally.rows.entry(case.group).or_default().is_luks_same += 1;
    } else {
        tally.differ(
            case,
            format!(
                "isLuks -v: cryptsetup exit {cs_code} {:?}, dmkit exit {dm_code} {:?}",
                String::from_utf8_lossy(&cs_says),
                String::from_utf8_lossy(&dm_says)
            ),
        );
    }
    let (cs_code, cs_text) = run_tool("cryptsetup", &["luksDump", s(&cs_img)]);
    let (dm_code, dm_text) = run_tool(DMKIT, &["luks", "dump", s(&dm_img)]);
    let (cs_ok, dm_ok) = (cs_code == 0, dm_code == 0);
    if let Some(want) = case.script_dump {
        if cs_ok != want {
            tally.differ(
                case,
                format!("cryptsetup luksDump accepts={cs_ok}, its script says {want}"),
            );
        }
    }
    let row = tally.rows.entry(case.group).or_default();
    match (cs_ok, dm_ok) {
        (true, true) => {
            row.both_accept += 1;
            if comparable(&cs_text) == comparable(&dm_text) {
                row.dump_same += 1;
            } else {
                tally.differ(
                    case,
                    format!(
                        "dump text differs:\n--- cryptsetup\n{}--- dmkit\n{}",
                        String::from_utf8_lossy(&cs_text),
                        String::from_utf8_lossy(&dm_text)
                    ),
                );
            }
        }
        (false, false) => row.both_refuse += 1,
        _ => tally.differ(
            case,
            format!("luksDump: cryptsetup exit {cs_code}, dmkit exit {dm_code}"),
        ),
    }

    let mut unlocked = Vec::new();
    for u in &case.unlocks {
        let key = match &u.secret {
            Secret::Pass(p) => {
                let k = work.join(format!("passphrase{}", unlocked.len()));
                std::fs::write(&k, p).unwrap();
                k
            }
            Secret::File(f) => f.clone(),
        };
        let mut extra: Vec<String> = vec!["--key-file".into(), s(&key).into()];
        if let Some(n) = u.slot {
            extra.extend(["-S".into(), n.to_string()]);
        }
        // Only test-passphrase knows --unbound; it is added below, not to the dump.
        let unbound = u.unbound.then_some("--unbound");
        let what = format!(
            "{}{}",
            match &u.secret {
                Secret::Pass(p) => format!("passphrase {p:?}"),
                Secret::File(f) => format!("key file {}", f.file_name().unwrap().to_string_lossy()),
            },
            u.slot.map_or(String::new(), |n| format!(" -S {n}"))
                + &unbound.map_or(String::new(), |u| format!(" {u}"))
        );
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let mut cs_args = vec!["open", "--test-passphrase"];
        cs_args.extend(&extra);
        cs_args.extend(unbound);
        cs_args.push(s(&cs_img));
        let mut dm_args = vec!["luks", "test-passphrase"];
        dm_args.extend(&extra);
        dm_args.extend(unbound);
        dm_args.push(s(&dm_img));
        let cs = run::output("cryptsetup", &cs_args);
        let cs_code = cs.status.code().unwrap_or(-1);
        let cs_needs_dm =
            String::from_utf8_lossy(&cs.stderr).contains("Cannot initialize device-mapper");
        let (dm_code, _) = run_tool(DMKIT, &dm_args);
        unlocked.push((
            u,
            what,
            extra.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            cs_code,
            dm_code,
            cs_needs_dm,
        ));
    }
    // A passphrase the script calls wrong that cryptsetup accepts shows a broken check in
    // cryptsetup itself (2.6.1 "verifies" any key against a digest whose hash its crypto
    // backend does not know: PBKDF2_digest_verify returns the base64 decoder's 0). dmkit must
    // not follow it there: on such a header it opens nothing.
    let cs_broken = unlocked
        .iter()
        .any(|(u, _, _, cs, _, _)| u.script == Some(false) && *cs == 0);
    if cs_broken {
        tally.rows.entry(case.group).or_default().cryptsetup_broken += 1;
        for (_, what, _, _, dm, _) in &unlocked {
            tally.rows.entry(case.group).or_default().unlocks += 1;
            if *dm == 0 {
                tally.differ(
                    case,
                    format!("{what}: dmkit opens where cryptsetup's key check is broken"),
                );
            }
        }
        unlocked.clear();
    }
    for (u, what, extra, cs_code, dm_code, cs_needs_dm) in unlocked {
        tally.rows.entry(case.group).or_default().unlocks += 1;
        if let (true, Some(want)) = (cs_needs_dm, u.script) {
            // cryptsetup cannot judge without device-mapper; its script's expectation does
            // (the volume key is checked by decrypting the data, in tests/luks_ciphers.rs).
            tally.rows.entry(case.group).or_default().by_script += 1;
            if (dm_code == 0) != want {
                tally.differ(
                    case,
                    format!(
                        "{what}: dmkit exit {dm_code}, the script expects success={want} \
                         (cryptsetup needs device-mapper for this keyslot's cipher)"
                    ),
                );
            }
            continue;
        }
        if let Some(want) = u.script {
            if (cs_code == 0) != want {
                tally.differ(
                    case,
                    format!("{what}: cryptsetup exit {cs_code}, its script expects success={want}"),
                );
            }
        }
        if cs_code != dm_code {
            tally.differ(
                case,
                format!("{what}: test-passphrase exit: cryptsetup {cs_code}, dmkit {dm_code}"),
            );
            continue;
        }
        tally.rows.entry(case.group).or_default().unlocks_same += 1;
        if cs_code != 0 {
            continue;
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let mut cs_args = vec!["luksDump", "--dump-volume-key", "-q"];
        cs_args.extend(&extra);
        cs_args.push(s(&cs_img));
        let mut dm_args = vec!["luks", "dump", "--dump-volume-key", "-q"];
        dm_args.extend(&extra);
        dm_args.push(s(&dm_img));
        let (cs_code, cs_vk) = run_tool("cryptsetup", &cs_args);
        let (dm_code, dm_vk) = run_tool(DMKIT, &dm_args);
        if cs_code == dm_code && comparable(&cs_vk) == comparable(&dm_vk) {
            tally.rows.entry(case.group).or_default().keys_same += 1;
        } else {
            tally.differ(
                case,
                format!(
                    "{what}: --dump-volume-key: cryptsetup exit {cs_code} {:?}, dmkit exit {dm_code} {:?}",
                    String::from_utf8_lossy(&cs_vk),
                    String::from_utf8_lossy(&dm_vk)
                ),
            );
        }
    }
    if std::fs::read(&dm_img).unwrap() != untouched {
        tally.differ(
            case,
            "dmkit changed the image in a read-only command".into(),
        );
    }
}
