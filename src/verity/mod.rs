//! dm-verity: a read-only device checked against a hash tree and a root hash.

pub mod superblock;
