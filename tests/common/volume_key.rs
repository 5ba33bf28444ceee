//! The volume key of a LUKS device as `luksDump --dump-volume-key` prints it: read from the
//! text (cryptsetup's or dmkit's, which print it alike), or asked of cryptsetup, so a test can
//! decrypt the data itself and check dmkit independently of dmkit.

/// The volume key in a `luksDump --dump-volume-key` text.
pub fn from_dump(text: &str) -> Vec<u8> {
    let start = text.find("MK dump:").expect("an MK dump line");
    let hex: String = text[start + 8..].split_whitespace().collect();
    hex::decode(hex).expect("the MK dump is hex")
}

/// The volume key cryptsetup unlocks on `device` (its header in `header` when detached) with
/// the passphrase in `pass_file`.
pub fn cryptsetup(pass_file: &str, device: &str, header: Option<&str>) -> Vec<u8> {
    let mut args = vec![
        "luksDump",
        "--dump-volume-key",
        "--batch-mode",
        "--key-file",
        pass_file,
    ];
    if let Some(h) = header {
        args.extend(["--header", h]);
    }
    args.push(device);
    from_dump(&super::run::ok("cryptsetup", &args))
}
