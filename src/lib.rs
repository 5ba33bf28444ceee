//! dmkit: the Linux at-rest protection stack — dm-verity, dm-integrity, dm-crypt/LUKS2 and
//! fs-verity — in userspace, on-disk compatible with the kernel and with
//! cryptsetup/veritysetup/integritysetup/fsverity-utils.
//!
//! Layers are block devices stacked on block devices ([`block::BlockDevice`]), as in
//! device-mapper; exporters ([`export`]) serve the top of a stack to the kernel.
#![deny(missing_docs)]

#[cfg(feature = "cli")]
pub mod bench;
pub mod block;
#[cfg(feature = "cli")]
pub mod cli;
pub mod codec;
pub mod crypt;
pub mod export;
pub mod fsverity;
pub mod hash;
pub mod image;
pub mod integrity;
pub mod logcap;
pub mod sig;
pub mod verity;
