//! Exporters: how the top of a stack reaches the kernel (a single-file FUSE export, optionally
//! with a loop device on top), and the daemon lifecycle behind `open`, `close` and `status`.

mod buf;
mod bytes;
pub mod daemon;
pub mod fuse;
pub mod loopdev;
pub mod mountinfo;

pub use daemon::{
    check_loop_allowed, claim_holder, close, ensure_not_open, name_for_mountpoint, open, open_tree,
    path_holder, run_dir, serve_foreground, serve_foreground_with, serve_tree_foreground, status,
    validate_name, CloseMode, Closed, ExportError, ExportSpec, Opened, StatsFn, TreeMounter,
    TreeSpec, DEFAULT_RUN_DIR, RUN_DIR_ENV,
};
pub use fuse::{ExportStats, FuseExport, FuseOptions, Mounted, DEFAULT_THREADS};
pub use loopdev::LoopDevice;
pub use mountinfo::is_mounted;
