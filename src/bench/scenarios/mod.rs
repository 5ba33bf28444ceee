//! What the benchmarks measure: one file per `dmkit bench` command (and the study it follows),
//! built on the sibling `harness` module.
//!
//! - [`overhead`] (`dmkit bench`): the fio matrix over the configurations of [`config`] (plain,
//!   [`verity`], integrity, crypt) side by side;
//! - [`format`](mod@format) (`dmkit bench format`): `dmkit verity format` against
//!   `veritysetup format` (with and without FEC); [`fec`]: reads and repair of a damaged
//!   image through dm-verity forward error correction;
//! - [`integrity`], [`verity_integrity`]: read-write runs through dm-integrity, and verity over
//!   integrity;
//! - [`cloudflare`] (`dmkit bench crypt`): Cloudflare's dm-crypt study; [`cipher`]: the cipher
//!   alone;
//! - [`nbd`]: the NBD export against qemu-storage-daemon's; [`export`]: the export as a
//!   dimension (FUSE, FUSE over io_uring, NBD, the kernel loop);
//! - [`fsverity_digest`], [`fsverity_read`]: `fsverity digest` against `dmkit fsverity digest`,
//!   and reads through `fsverity mount`;
//! - [`image`] (`dmkit bench image`, seed 001) with its default tree from [`image_tree`];
//! - [`reencrypt`]: `cryptsetup reencrypt` against `dmkit luks reencrypt` offline;
//! - [`rootless`] (`dmkit bench rootless`): `image open` as an ordinary user against the
//!   kernel mount as root, and `image mtree` against hashing the kernel mount.

pub mod bound;
pub mod cipher;
pub mod cloudflare;
pub mod config;
pub mod export;
pub mod fec;
pub mod format;
pub mod fsverity_digest;
pub mod fsverity_read;
pub mod image;
pub mod image_tree;
pub mod integrity;
pub mod nbd;
pub mod overhead;
pub mod reencrypt;
pub mod remote;
pub mod rootless;
pub mod verity;
pub mod verity_integrity;
