//! The `dmkit` command; all logic lives in the library's `cli` module.

fn main() {
    std::process::exit(dmkit::cli::main());
}
