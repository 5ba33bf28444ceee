//! Exporters: how the top of a stack reaches the kernel (a single-file FUSE export, optionally
//! with a loop device on top), and the daemon lifecycle behind `open`, `close` and `status`.
