//! The sidecar store: each sealed file's Merkle tree kept beside the manifest, never inside
//! the files.
//!
//! One file per distinct digest, named by the digest in hex, holding the 256-byte fs-verity
//! descriptor then the Merkle tree exactly as the kernel stores it (root level first): the same
//! bytes as `fsverity digest --out-descriptor` followed by `--out-merkle-tree`. Identical files
//! share one tree.
//!
//! Nothing in the store is trusted: [`load`] checks every descriptor against the manifest's
//! digest and every tree block against the root hash before a mount serves anything, and
//! reads at run time check each tree block again against its (verified) parent when it is read
//! back from disk.

use super::manifest::Manifest;
use super::SealError;
use crate::fsverity::descriptor::{Descriptor, DESCRIPTOR_SIZE};
use crate::fsverity::{MerkleTree, TreeGeometry};
use crate::hash::hash_blocks;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The store file name of a digest.
pub fn file_name(digest: &[u8]) -> String {
    hex::encode(digest)
}

/// Write `tree`'s store file in `dir` (created or replaced).
pub fn write_tree(dir: &Path, tree: &MerkleTree) -> Result<(), SealError> {
    let path = dir.join(file_name(&tree.digest.digest));
    let io = |e: std::io::Error| SealError::Io {
        path: path.clone(),
        reason: e.to_string(),
    };
    let mut f = File::create(&path).map_err(io)?;
    f.write_all(&tree.digest.descriptor.to_bytes())
        .and_then(|()| f.write_all(&tree.tree))
        .map_err(io)
}

/// A verified tree of the store: what a read needs to check a file's blocks.
#[derive(Debug)]
pub struct StoredTree {
    /// The store file.
    pub path: PathBuf,
    /// The file digest it was found under.
    pub digest: Vec<u8>,
    /// The tree's root hash (from the verified descriptor).
    pub root_hash: Vec<u8>,
    /// The size of the data it covers.
    pub data_size: u64,
    /// Where each level is.
    pub geometry: TreeGeometry,
}

impl StoredTree {
    /// Byte offset of tree block `index` of `level` in the store file.
    pub fn block_offset(&self, level: usize, index: u64, block_size: u64) -> u64 {
        DESCRIPTOR_SIZE as u64 + level_offset(&self.geometry, level) + index * block_size
    }
}

/// The store's trees, checked: one per distinct digest of the manifest, and for each manifest
/// entry (by index) the tree its file uses.
#[derive(Debug)]
pub struct Store {
    /// The verified trees.
    pub trees: Vec<StoredTree>,
    /// Entry index -> tree index, for regular files.
    pub tree_of: HashMap<usize, u32>,
}

/// Load and check every tree `manifest` needs from the store directory `dir`. Refuses (naming
/// the store file and what is wrong) a missing file, a descriptor whose hash is not the
/// manifest's digest or whose parameters or size differ from the manifest's, a file of the
/// wrong length, and any tree block that does not hash to its parent's entry.
pub fn load(dir: &Path, manifest: &Manifest) -> Result<Store, SealError> {
    let mut trees: Vec<StoredTree> = Vec::new();
    let mut by_digest: HashMap<&[u8], u32> = HashMap::new();
    let mut tree_of = HashMap::new();
    for (i, entry, size, digest) in manifest.files() {
        let id = match by_digest.get(digest) {
            Some(&id) => id,
            None => {
                if trees.len() >= super::verify::MAX_TREES {
                    return Err(SealError::Invalid(format!(
                        "{}: more than {} distinct files",
                        dir.display(),
                        super::verify::MAX_TREES
                    )));
                }
                let t = load_one(dir, digest, manifest)?;
                let id = trees.len() as u32;
                trees.push(t);
                by_digest.insert(digest, id);
                id
            }
        };
        let t = &trees[id as usize];
        if t.data_size != size {
            return Err(SealError::BadStore {
                path: t.path.clone(),
                reason: format!(
                    "measures {} bytes, but the manifest says {:?} has {size}",
                    t.data_size, entry.path
                ),
            });
        }
        tree_of.insert(i, id);
    }
    Ok(Store { trees, tree_of })
}

fn load_one(dir: &Path, digest: &[u8], manifest: &Manifest) -> Result<StoredTree, SealError> {
    let params = &manifest.params;
    let path = dir.join(file_name(digest));
    let bad = |reason: String| SealError::BadStore {
        path: path.clone(),
        reason,
    };
    let file = File::open(&path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| bad(format!("cannot stat: {e}")))?
        .len();
    let mut desc = [0u8; DESCRIPTOR_SIZE];
    if len < DESCRIPTOR_SIZE as u64 {
        return Err(bad(format!(
            "{len} bytes: too short for an fs-verity descriptor"
        )));
    }
    file.read_exact_at(&mut desc, 0)
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    if params.hash.hash(&[&desc]) != digest {
        return Err(bad(
            "its descriptor does not hash to the file digest the manifest names".into(),
        ));
    }
    let d = Descriptor::from_bytes(&desc)
        .ok_or_else(|| bad("the descriptor is not a valid fs-verity descriptor".into()))?;
    if d.hash != params.hash
        || u32::from(d.log_blocksize) != params.block_size.trailing_zeros()
        || d.salt != params.salt
    {
        return Err(bad(
            "the descriptor's hash, block size or salt differ from the manifest's".into(),
        ));
    }
    let geometry = TreeGeometry::new(d.data_size, params).map_err(|e| bad(e.to_string()))?;
    let want = DESCRIPTOR_SIZE as u64 + geometry.tree_size();
    if len != want {
        return Err(bad(format!(
            "{len} bytes, expected {want} (descriptor and Merkle tree of a {}-byte file)",
            d.data_size
        )));
    }
    let t = StoredTree {
        path: path.clone(),
        digest: digest.to_vec(),
        root_hash: d.root_hash,
        data_size: d.data_size,
        geometry,
    };
    verify_whole_tree(&file, &t, manifest).map_err(bad)?;
    Ok(t)
}

/// Check every block of a stored tree: the top level's one block against the root hash, each
/// level's blocks against the hashes in the level above. Every byte of the tree is in a block
/// whose hash is checked, padding included.
fn verify_whole_tree(file: &File, t: &StoredTree, manifest: &Manifest) -> Result<(), String> {
    let g = &t.geometry;
    if g.levels() == 0 {
        return Ok(());
    }
    let params = &manifest.params;
    let bs = params.block_size as usize;
    let ds = params.hash.digest_size();
    let prefix = super::verify::salt_prefix(params);
    let mut tree = vec![0u8; g.tree_size() as usize];
    file.read_exact_at(&mut tree, DESCRIPTOR_SIZE as u64)
        .map_err(|e| format!("cannot read the Merkle tree: {e}"))?;
    let level = |l: usize| {
        let off = level_offset(g, l) as usize;
        &tree[off..off + g.level_blocks(l) as usize * bs]
    };
    let top = g.levels() - 1;
    let mut hashes = vec![0u8; ds];
    hash_blocks(params.hash, &prefix, &[], level(top), bs, &mut hashes);
    if hashes != t.root_hash {
        return Err("the top Merkle tree block does not hash to the root hash".into());
    }
    for l in (0..top).rev() {
        let blocks = level(l);
        hashes.resize(blocks.len() / bs * ds, 0);
        hash_blocks(params.hash, &prefix, &[], blocks, bs, &mut hashes);
        let parent = level(l + 1);
        if let Some(bad) = hashes
            .chunks_exact(ds)
            .zip(parent.chunks_exact(ds))
            .position(|(h, p)| h != p)
        {
            return Err(format!(
                "Merkle tree block {bad} of level {l} does not match its hash in level {}",
                l + 1
            ));
        }
    }
    Ok(())
}

/// Byte offset of `level` in a stored tree; callers only walk levels below `levels()`, where
/// the geometry always has an offset.
pub(super) fn level_offset(g: &TreeGeometry, level: usize) -> u64 {
    g.level_offset(level).unwrap_or_default()
}
