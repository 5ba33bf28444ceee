//! What activating a volume gives (the userspace `dmsetup create`): the top of its stack, with
//! everything an export needs to serve it and `status` needs to describe it. Every format's
//! handle (`LuksVolume`, `PlainVolume`, `VerityVolume`, `IntegrityVolume`, linear) returns one;
//! an export is then built from it (`export::ExportSpec::new`), never assembled by hand.

use super::{BlockDevice, Claim};
use serde_json::Value;
use std::sync::Arc;

/// Live counters of a layer, shown by `status` (called on the server's control thread).
pub type StatsFn = Arc<dyn Fn() -> Value + Send + Sync>;

/// An activated volume: its name, the top device of its stack, what `status` shows of it, and
/// the claims on backing storage it holds for as long as it is served.
pub struct Activated {
    /// The device name (`$RUN_DIR/NAME`, like `/dev/mapper/NAME`).
    pub name: String,
    /// The top of the stack to serve.
    pub device: Arc<dyn BlockDevice>,
    /// device-mapper's word for the top target ("crypt", "verity", "integrity", "linear").
    pub kind: String,
    /// Static facts shown by `status` (backing paths, root hash, cipher, options).
    pub details: Value,
    /// Live counters shown by `status`.
    pub stats: Option<StatsFn>,
    /// The claims on backing storage this device holds while it is open (see [`Claim`]).
    pub claims: Vec<Claim>,
    /// Whether discards are passed down (`--allow-discards`, or the volume's persistent flag).
    pub allow_discards: bool,
    /// What the server may ask of the volume while it is open (resize, suspend, resume,
    /// refresh); `None` for volumes that support none of it.
    pub online: Option<Arc<dyn super::online::Online>>,
}
