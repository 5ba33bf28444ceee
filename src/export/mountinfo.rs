//! What is mounted where, from `/proc/self/mountinfo`.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Unescape a path field of /proc/self/mountinfo (`\040` for space, etc.).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Whether something is mounted at `path` (compared as given: pass a resolved path).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.as_os_str().as_bytes();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| unescape(mp) == want)
}

/// Whether a FUSE filesystem of dmkit's (source `dmkit`) is mounted at `path` (a resolved
/// path): what a dead tree server may have left over a user's directory.
pub fn is_dmkit_fuse_mount(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.as_os_str().as_bytes();
    text.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (Some(head), Some(tail)) = (halves.next(), halves.next()) else {
            return false;
        };
        let mut t = tail.split(' ');
        let (fstype, source) = (t.next().unwrap_or(""), t.next().unwrap_or(""));
        head.split(' ')
            .nth(4)
            .is_some_and(|mp| unescape(mp) == want)
            && (fstype == "fuse" || fstype == "fuse.dmkit")
            && source == "dmkit"
    })
}

/// Where the block device `major:minor` is mounted, if anywhere (the first mount point).
pub fn mount_point_of(major: u32, minor: u32) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = format!("{major}:{minor}");
    text.lines().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let mp = f.nth(1)?;
        (dev == want).then(|| String::from_utf8_lossy(&unescape(mp)).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_escapes() {
        assert_eq!(unescape(r"/a\040b\134c"), b"/a b\\c");
        assert_eq!(unescape(r"/x\04"), b"/x\\04");
    }

    #[test]
    fn proc_is_mounted() {
        // Not "/": in a chroot the root is a plain directory, while /proc is mounted anywhere
        // the kernel's mount table can be read at all.
        assert!(is_mounted(Path::new("/proc")));
        assert!(!is_mounted(Path::new("/no/such/mount/point")));
    }
}
