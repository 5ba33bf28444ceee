//! Exporters: how the top of a stack reaches its users (a single-file FUSE export, optionally
//! with a loop device on top; an NBD server for virtual machines and other hosts), and the
//! daemon lifecycle behind `open`, `close` and `status`. The exporters of one device share its
//! byte-granular access (`bytes`).

mod bytes;
pub mod daemon;
pub mod fuse;
pub mod loopdev;
pub mod mountinfo;
pub mod nbd;

pub use daemon::{
    check_loop_allowed, claim_holder, close, ensure_not_open, name_for_mountpoint, open, open_tree,
    path_holder, resolve_target, run_dir, serve_foreground, serve_foreground_with,
    serve_tree_foreground, shell_word, status, typeable, validate_name, CloseMode, Closed,
    ExportError, ExportSpec, Opened, ServeOptions, StatsFn, TreeMounter, TreeSpec, DEFAULT_RUN_DIR,
    RUN_DIR_ENV,
};
pub use fuse::{mount_device, ExportStats, FuseOptions, Mounted, DEFAULT_THREADS};
pub use loopdev::LoopDevice;
pub use mountinfo::is_mounted;
