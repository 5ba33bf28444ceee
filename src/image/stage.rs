//! A copy of a tree with files added, the tree itself untouched: `image build` adds an
//! extension-release file this way. The copy is made of hard links where the staging
//! directory shares the tree's file system (cheap, same bytes, and mkfs sees each inode once
//! so no hard link appears that the tree did not have), else of copies (`cp -a`, reflinks
//! where the file system has them).

use super::image_type::Addition;
use super::{ImageError, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A staged tree, removed when dropped.
#[derive(Debug)]
pub struct Staged {
    dir: PathBuf,
}

impl Staged {
    /// The staged tree's root.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stage `tree` in `dir` (which must not exist) with `add` written into it.
pub fn stage(tree: &Path, dir: PathBuf, add: &Addition) -> Result<Staged> {
    std::fs::create_dir(&dir)
        .map_err(|e| ImageError::Io(format!("{}: cannot create: {e}", dir.display())))?;
    let staged = Staged { dir };
    // The directory takes the tree root's mode and owner with `cp -a`'s "/." form.
    let src = format!("{}/.", tree.display());
    let linked = cp(&["-a", "-l", &src], &staged.dir);
    if linked.is_err() {
        // Another file system (or a tree we may not link): copy instead, from empty.
        let _ = std::fs::remove_dir_all(&staged.dir);
        std::fs::create_dir(&staged.dir)
            .map_err(|e| ImageError::Io(format!("{}: cannot create: {e}", staged.dir.display())))?;
        cp(&["-a", "--reflink=auto", &src], &staged.dir)?;
    }
    let file = staged.dir.join(&add.path);
    if let Some(parent) = file.parent() {
        create_dirs(&staged.dir, parent)?;
    }
    std::fs::write(&file, &add.contents)
        .and_then(|()| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)))
        .map_err(|e| ImageError::Io(format!("{}: cannot write: {e}", file.display())))?;
    Ok(staged)
}

/// Create the missing directories from `root` down to `dir`, mode 0755.
fn create_dirs(root: &Path, dir: &Path) -> Result<()> {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        if !at.is_dir() {
            std::fs::create_dir(&at)
                .and_then(|()| {
                    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(|e| ImageError::Io(format!("{}: cannot create: {e}", at.display())))?;
        }
    }
    Ok(())
}

fn cp(args: &[&str], dest: &Path) -> Result<()> {
    let out = Command::new("cp")
        .args(args)
        .arg(dest)
        .output()
        .map_err(|e| ImageError::Missing(format!("cp: cannot run: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(ImageError::Tool(format!(
        "cp {} {}: {}",
        args.join(" "),
        dest.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}
