//! What an image is for, as systemd tells its images apart: a root file system, a `/usr`
//! partition, a system extension (sysext: `/usr` and `/opt` merged over the host's), a
//! configuration extension (confext: `/etc`), or a portable service. Each type fixes the
//! partition types, the sidecar names of split images, and what the tree must hold; for the
//! extensions this module writes the `extension-release` file systemd-sysext matches against
//! the host when the tree has none.

use super::dps::Role;
use super::{ImageError, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The image types of `image build --type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageType {
    /// A root file system (root, root-verity, root-verity-sig partitions).
    #[default]
    Root,
    /// A `/usr` file system: the tree is what is mounted at `/usr` (usr, usr-verity,
    /// usr-verity-sig partitions; `.usrhash` beside a split image).
    Usr,
    /// A system extension: `usr/` and `opt/` only, with
    /// `usr/lib/extension-release.d/extension-release.NAME`.
    Sysext,
    /// A configuration extension: `etc/` only, with
    /// `etc/extension-release.d/extension-release.NAME`.
    Confext,
    /// A portable service image: a whole tree with an os-release file.
    Portable,
}

/// Every type, in the order `--help` lists them.
pub const ALL: [ImageType; 5] = [
    ImageType::Root,
    ImageType::Usr,
    ImageType::Sysext,
    ImageType::Confext,
    ImageType::Portable,
];

impl ImageType {
    /// Parse `--type`.
    pub fn parse(s: &str) -> Option<ImageType> {
        ALL.into_iter().find(|t| t.name() == s)
    }

    /// The name `--type` takes.
    pub fn name(self) -> &'static str {
        match self {
            ImageType::Root => "root",
            ImageType::Usr => "usr",
            ImageType::Sysext => "sysext",
            ImageType::Confext => "confext",
            ImageType::Portable => "portable",
        }
    }

    /// The role of the file system partition. Extensions and portable images are root
    /// partitions, as systemd-repart's own sysext/confext/portable definitions make them.
    pub fn data_role(self) -> Role {
        match self {
            ImageType::Usr => Role::Usr,
            _ => Role::Root,
        }
    }

    /// The suffix of a split image's root hash file (the signature adds `.p7s`), as systemd
    /// looks for it.
    pub fn hash_suffix(self) -> &'static str {
        match self.data_role() {
            Role::Usr => ".usrhash",
            _ => ".roothash",
        }
    }

    /// The top-level entries the tree may hold (`None`: any).
    fn allowed_top(self) -> Option<&'static [&'static str]> {
        match self {
            ImageType::Sysext => Some(&["usr", "opt"]),
            ImageType::Confext => Some(&["etc"]),
            _ => None,
        }
    }

    /// Where the extension-release file of an extension named `name` lies in the tree.
    pub fn release_path(self, name: &str) -> Option<PathBuf> {
        let dir = match self {
            ImageType::Sysext => "usr/lib/extension-release.d",
            ImageType::Confext => "etc/extension-release.d",
            _ => return None,
        };
        Some(Path::new(dir).join(format!("extension-release.{name}")))
    }
}

/// A file the build adds to the tree: its path inside the tree and its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addition {
    /// Relative path inside the tree.
    pub path: PathBuf,
    /// The file's bytes.
    pub contents: String,
}

/// The name systemd gives an image file: its file name without `.raw`.
pub fn image_name(output: &Path) -> Option<String> {
    let n = output.file_name()?.to_str()?;
    let n = n.strip_suffix(".raw").unwrap_or(n);
    (!n.is_empty()).then(|| n.to_string())
}

/// Check `tree` for an image of type `ty` written to `output`, and say what must be added:
/// the extension-release file from `fields` (KEY=VALUE, over the defaults: the host's
/// os-release `ID` and `VERSION_ID` when no `ID` is given, and `ARCHITECTURE`), unless the
/// tree has one.
pub fn plan(
    ty: ImageType,
    tree: &Path,
    output: &Path,
    arch: &str,
    fields: &[(String, String)],
    host_os_release: &Path,
) -> Result<Option<Addition>> {
    if let Some(allowed) = ty.allowed_top() {
        check_top(ty, tree, allowed)?;
    }
    if ty == ImageType::Portable
        && !["usr/lib/os-release", "etc/os-release"]
            .iter()
            .any(|p| tree.join(p).exists())
    {
        return Err(ImageError::Invalid(format!(
            "{}: a portable service image needs usr/lib/os-release or etc/os-release in the tree \
             (portablectl reads it)",
            tree.display()
        )));
    }
    let name = image_name(output).ok_or_else(|| {
        ImageError::Invalid(format!("{}: no image name in the path", output.display()))
    })?;
    let Some(rel) = ty.release_path(&name) else {
        if !fields.is_empty() {
            return Err(ImageError::Invalid(format!(
                "--extension-release: only sysext and confext images carry an extension-release \
                 file, not --type {}",
                ty.name()
            )));
        }
        return Ok(None);
    };
    let existing = tree.join(&rel);
    if existing.exists() {
        if !fields.is_empty() {
            return Err(ImageError::Invalid(format!(
                "{}: the tree has its extension-release file already; drop --extension-release \
                 or the file",
                existing.display()
            )));
        }
        let text = std::fs::read_to_string(&existing).map_err(|e| {
            ImageError::Invalid(format!("{}: cannot read: {e}", existing.display()))
        })?;
        require_id(&parse_release(&text), &existing.display().to_string())?;
        return Ok(None);
    }
    let host = std::fs::read_to_string(host_os_release)
        .map(|t| parse_release(&t))
        .unwrap_or_default();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| match out.iter_mut().find(|(ok, _)| ok == k) {
        Some(e) => e.1 = v.to_string(),
        None => out.push((k.to_string(), v.to_string())),
    };
    // The host's ID and VERSION_ID describe what the extension is for unless an ID is given
    // (then the host's version means nothing for it).
    match fields.iter().find(|(k, _)| k == "ID") {
        Some((_, id)) => set("ID", id),
        None => {
            for key in ["ID", "VERSION_ID"] {
                if let Some((_, v)) = host.iter().find(|(k, _)| k == key) {
                    set(key, v);
                }
            }
        }
    }
    set("ARCHITECTURE", arch);
    for (k, v) in fields {
        set(k, v);
    }
    require_id(
        &out,
        &format!(
            "--extension-release ({} has no ID)",
            host_os_release.display()
        ),
    )?;
    let mut contents = String::new();
    for (k, v) in &out {
        let _ = writeln!(contents, "{k}={v}");
    }
    Ok(Some(Addition {
        path: rel,
        contents,
    }))
}

/// Parse `--extension-release KEY=VALUE`: an os-release key (capitals, digits, `_`) and a
/// value on one line.
pub fn parse_field(s: &str) -> Result<(String, String)> {
    let bad = |why: &str| {
        ImageError::Invalid(format!(
            "--extension-release {s:?}: {why} (give KEY=VALUE, e.g. ID=debian)"
        ))
    };
    let (k, v) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
    if k.is_empty()
        || !k
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(bad("the key is not an os-release key"));
    }
    if v.contains(['\n', '\r', '\0']) {
        return Err(bad("the value spans lines"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// The KEY=VALUE pairs of an os-release style file (quotes removed, comments skipped).
pub fn parse_release(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|x| x.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
                .unwrap_or(v);
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

fn require_id(fields: &[(String, String)], whence: &str) -> Result<()> {
    match fields.iter().find(|(k, _)| k == "ID") {
        Some((_, v)) if !v.is_empty() => Ok(()),
        _ => Err(ImageError::Invalid(format!(
            "{whence}: an extension-release file needs ID= (the host's ID, or _any), which \
             systemd-sysext compares with the host's os-release"
        ))),
    }
}

fn check_top(ty: ImageType, tree: &Path, allowed: &[&str]) -> Result<()> {
    let entries = std::fs::read_dir(tree)
        .map_err(|e| ImageError::Invalid(format!("{}: cannot read: {e}", tree.display())))?;
    let mut extra: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !allowed.contains(&n.as_str()))
        .collect();
    extra.sort();
    if extra.is_empty() {
        return Ok(());
    }
    Err(ImageError::Invalid(format!(
        "{}: a {} image holds only {} at its top; the tree also has {}",
        tree.display(),
        ty.name(),
        allowed
            .iter()
            .map(|a| format!("{a}/"))
            .collect::<Vec<_>>()
            .join(" and "),
        extra.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for f in files {
            let p = d.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "ID=_any\n").unwrap();
        }
        d
    }

    #[test]
    fn a_sysext_gets_its_release_file_from_the_host_and_the_fields() {
        let t = tree(&["usr/bin/hello"]);
        let h = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(h.path(), "NAME=\"Debian\"\nID=debian\nVERSION_ID=\"12\"\n").unwrap();
        let fields = vec![parse_field("SYSEXT_LEVEL=1.0").unwrap()];
        let a = plan(
            ImageType::Sysext,
            t.path(),
            Path::new("/x/hello.raw"),
            "x86-64",
            &fields,
            h.path(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            a.path,
            Path::new("usr/lib/extension-release.d/extension-release.hello")
        );
        assert_eq!(
            a.contents,
            "ID=debian\nVERSION_ID=12\nARCHITECTURE=x86-64\nSYSEXT_LEVEL=1.0\n"
        );
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let t = tree(&["usr/bin/a", "etc/b"]);
        let none = Path::new("/nonexistent/os-release");
        let e = plan(
            ImageType::Sysext,
            t.path(),
            Path::new("e.raw"),
            "x86-64",
            &[],
            none,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the tree also has etc"), "{e}");
        let t = tree(&["usr/bin/a"]);
        let e = plan(
            ImageType::Sysext,
            t.path(),
            Path::new("e.raw"),
            "x86-64",
            &[],
            none,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs ID="), "{e}");
        let e = plan(
            ImageType::Portable,
            t.path(),
            Path::new("p.raw"),
            "x86-64",
            &[],
            none,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("os-release"), "{e}");
        assert!(parse_field("id=x").is_err());
        assert!(parse_field("ID").is_err());
        let t = tree(&["etc/extension-release.d/extension-release.c"]);
        assert_eq!(
            plan(
                ImageType::Confext,
                t.path(),
                Path::new("c.raw"),
                "x86-64",
                &[],
                none
            )
            .unwrap(),
            None
        );
    }
}
