//! Benchmarks: drive real `fio` against our exports and print overhead tables shaped like the
//! source documents' tables.
