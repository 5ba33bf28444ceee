//! dmkit: the Linux at-rest protection stack — dm-verity, dm-integrity, dm-crypt/LUKS2 and
//! fs-verity — in userspace, on-disk compatible with the kernel and with
//! cryptsetup/veritysetup/integritysetup/fsverity-utils.
//!
//! Layers are block devices stacked on block devices ([`block::BlockDevice`]), as in
//! device-mapper; exporters ([`export`]) serve the top of a stack to the kernel.
//!
//! # One handle per format
//!
//! As libcryptsetup's `crypt_device`, each format has one handle that owns its device, its
//! header or superblock, its claims on backing storage and its secrets, with the verbs as
//! methods; every decision (LUKS1 or LUKS2, the crash-safe order of a keyslot change, the
//! integrity wipe order) is made inside it:
//!
//! | format | handle | verbs |
//! |--------|--------|-------|
//! | LUKS2 and LUKS1 | [`crypt::luks::LuksVolume`], [`crypt::luks::Formatter`] | format, open, unlock, add/change/kill keyslot, UUID and label, header backup and restore ([`crypt::luks::HeaderRestore`]), dump, activate |
//! | plain dm-crypt | [`crypt::plain::PlainVolume`] | activate |
//! | dm-verity | [`verity::VerityVolume`] | format, open (superblock, root hash signature), verify, activate |
//! | dm-integrity | [`integrity::IntegrityVolume`] | format (with integritysetup's checks), open, verify, activate |
//! | linear | [`block::linear::activate`] | activate |
//!
//! Activating gives one [`block::Activated`]: the top [`block::BlockDevice`] of the stack (read
//! and write it directly), what `status` shows of it, and the claims it holds. Every export is
//! built from that value with [`export::ExportSpec::new`] and [`export::ServeOptions`] (a FUSE
//! file, a loop device, NBD), then served by [`export::open`] (in the background, until
//! `close`) or [`export::serve_foreground`].
//!
//! ```no_run
//! use dmkit::block::BlockDevice;
//! use dmkit::crypt::luks::{ActivateParams, LuksVolume};
//! use dmkit::export::{self, ExportSpec, ServeOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let volume = LuksVolume::open("disk.img".as_ref(), None, false, None)?;
//! let data = volume.data(false)?;
//! let params = ActivateParams {
//!     name: "disk".into(),
//!     ..ActivateParams::default()
//! };
//! let active = volume.activate(data, b"passphrase", None, &params)?;
//! let mut sector = [0u8; 512];
//! active.device.read_at(&mut sector, 0)?;
//! // Serve the decrypted device as the file $RUN_DIR/disk until `dmkit close disk`.
//! let how = ServeOptions {
//!     fuse: true,
//!     ..ServeOptions::default()
//! };
//! let opened = export::open(ExportSpec::new(active, how))?;
//! println!("{}", opened.path.display());
//! # Ok(())
//! # }
//! ```
//!
//! `examples/` holds three small programs that use only this public API:
//! `luks_read_sector` (open a LUKS2 image, read a sector), `verity_format_verify` (format a
//! verity hash tree, verify it, see a flipped byte caught) and `integrity_nbd` (serve a
//! dm-integrity image over NBD).
//!
//! The command line (`dmkit::cli`) and the benchmarks (`dmkit::bench`) are built with the default
//! feature `cli`; a program embedding dmkit depends on it with `default-features = false` and
//! builds without clap or fio code.
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
pub mod remote;
pub mod sig;
pub mod verity;
