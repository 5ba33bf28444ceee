//! `replay_journal`: what the kernel does with the journal when a device is activated. The
//! journal is read, the commit sequence of every sector identified, the consistent run of
//! sections found, its used entries copied in place, and the journal either continued or
//! cleared, exactly as the kernel decides, so that either side can replay the other's journal.

use super::device::Inner;
use super::journal::{
    commit_id, copy_section, entry_unused, init_sections, next_seq, prev_seq, write_sections,
    JState, JournalMap, N_COMMIT_IDS,
};
use super::rw_meta::{Layout, Mode, JOURNAL_SECTOR_DATA};
use crate::block::{BlockError, Result};

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Sections whose entries were copied in place (0: the journal was empty).
    pub replayed_sections: u32,
    /// Whether the journal was rewritten clean (`clear_journal`).
    pub cleared: bool,
}

fn find_seq(mem: &[u8], m: JournalMap<'_>, i: u32, j: u32) -> Option<u8> {
    let o = m.sector(i, j) + JOURNAL_SECTOR_DATA;
    let mut b = [0u8; 8];
    b.copy_from_slice(&mem[o..o + 8]);
    let id = u64::from_le_bytes(b);
    (0..N_COMMIT_IDS).find(|&k| commit_id(i, j, k) == id)
}

/// Read the journal from the device, replay it for `mode`, and return the journal state to
/// continue with. A sector whose commit id matches no sequence is refused before anything is
/// written (the kernel marks the device failed and clears its journal).
pub fn replay(inner: &Inner, mode: Mode) -> Result<(JState, Vec<u8>, ReplayReport)> {
    let l: &Layout = &inner.layout;
    let mut mem = vec![0u8; l.journal_bytes()];
    inner.lower.read_at(&mut mem, l.journal_offset())?;
    let m = JournalMap(l);
    let mut journal_empty = true;
    let mut used = [false; N_COMMIT_IDS as usize];
    let mut max_sections = [0u32; N_COMMIT_IDS as usize];
    for i in 0..l.journal_sections {
        for j in 0..l.journal_section_sectors {
            let Some(k) = find_seq(&mem, m, i, j) else {
                return Err(BlockError::Io {
                    device: inner.name.clone(),
                    offset: l.journal_offset() + m.sector(i, j) as u64,
                    source: std::io::Error::other(format!(
                        "journal commit id of section {i} sector {j} is invalid (not a dm-integrity journal, or a corrupt one)"
                    )),
                });
            };
            used[k as usize] = true;
            max_sections[k as usize] = i;
        }
        if journal_empty {
            journal_empty =
                (0..l.journal_section_entries).all(|e| entry_unused(&mem, m.entry(i, e)));
        }
    }
    let unused: u8 = if !used[N_COMMIT_IDS as usize - 1] {
        let mut u = N_COMMIT_IDS - 1;
        while u > 0 && !used[u as usize - 1] {
            u -= 1;
        }
        u
    } else {
        match (0..N_COMMIT_IDS).find(|&u| !used[u as usize]) {
            Some(u) => u,
            None => {
                return Err(BlockError::Io {
                    device: inner.name.clone(),
                    offset: l.journal_offset(),
                    source: std::io::Error::other(
                        "journal commit ids: all four sequences in use (corrupt journal)",
                    ),
                })
            }
        }
    };
    let last_used = prev_seq(unused);
    let mut want = prev_seq(last_used);
    if !used[want as usize] && used[prev_seq(want) as usize] {
        journal_empty = true;
    }
    let mut write_start = max_sections[last_used as usize] + 1;
    if write_start >= l.journal_sections {
        want = next_seq(want);
        write_start -= l.journal_sections;
    }
    let mut i = write_start;
    let mut write_sections_n = 0u32;
    'outer: while write_sections_n < l.journal_sections {
        for j in 0..l.journal_section_sectors {
            let o = m.sector(i, j) + JOURNAL_SECTOR_DATA;
            if mem[o..o + 8] != commit_id(i, j, want).to_le_bytes() {
                break 'outer;
            }
        }
        i += 1;
        if i >= l.journal_sections {
            want = next_seq(want);
            i = 0;
        }
        write_sections_n += 1;
    }
    let mut replayed = 0;
    if !journal_empty {
        let ss = l.journal_section_sectors as usize * 512;
        let mut problem = None;
        let mut tags = Vec::new();
        for k in 0..write_sections_n {
            let i = ((write_start + k) % l.journal_sections) as usize;
            copy_section(
                inner,
                &mut mem[i * ss..(i + 1) * ss],
                true,
                &mut tags,
                &mut problem,
            )?;
        }
        inner.lower.flush()?;
        if let Some(p) = problem {
            return Err(BlockError::Io {
                device: inner.name.clone(),
                offset: l.journal_offset(),
                source: std::io::Error::other(p),
            });
        }
        replayed = write_sections_n;
    }
    if write_sections_n == l.journal_sections && (mode == Mode::Journal || journal_empty) {
        let st = JState::new(l, write_start, want);
        return Ok((
            st,
            mem,
            ReplayReport {
                replayed_sections: replayed,
                cleared: false,
            },
        ));
    }
    // clear_journal
    let erase_seq = prev_seq(prev_seq(last_used));
    let mut s = write_start;
    init_sections(l, &mut mem, s, 1, erase_seq);
    write_sections(inner, &mem, s, 1)?;
    s = (s + 1) % l.journal_sections;
    if l.journal_sections >= 2 {
        let n = l.journal_sections - 2;
        if n > 0 {
            init_sections(l, &mut mem, s, n, erase_seq);
            write_sections(inner, &mem, s, n)?;
        }
        s = (s + n) % l.journal_sections;
        init_sections(l, &mut mem, s, 1, erase_seq);
        write_sections(inner, &mem, s, 1)?;
    }
    let st = JState::new(l, 0, next_seq(erase_seq));
    Ok((
        st,
        mem,
        ReplayReport {
            replayed_sections: replayed,
            cleared: true,
        },
    ))
}
