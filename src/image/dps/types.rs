//! The partition types of the Discoverable Partitions Specification that dmkit writes and
//! reads: root and /usr, their verity and verity signature partitions, for each architecture
//! Debian 12's systemd (252) names, and the ESP. Names and GUIDs as `systemd-id128 show` prints
//! them (tests/image.rs compares the whole table with it).

use super::{g, PartType, Role};

/// The architectures of [`KNOWN`], as systemd spells them (`uname -m` spellings differ).
pub const ARCHITECTURES: &[&str] = &[
    "x86",
    "x86-64",
    "arm",
    "arm64",
    "riscv64",
    "loongarch64",
    "ppc64-le",
    "s390x",
];

/// Every known partition type.
pub const KNOWN: &[PartType] = &[
    t(
        b"44479540f29741b29af7d131d5f0458a",
        "root-x86",
        Role::Root,
        Some("x86"),
    ),
    t(
        b"d13c5d3bb5d1422ab29f9454fdc89d76",
        "root-x86-verity",
        Role::RootVerity,
        Some("x86"),
    ),
    t(
        b"5996fc05109c48de808b23fa0830b676",
        "root-x86-verity-sig",
        Role::RootVeritySig,
        Some("x86"),
    ),
    t(
        b"75250d768cc6458ebd66bd47cc81a812",
        "usr-x86",
        Role::Usr,
        Some("x86"),
    ),
    t(
        b"8f461b0d14ee4e819aa9049b6fb97abd",
        "usr-x86-verity",
        Role::UsrVerity,
        Some("x86"),
    ),
    t(
        b"974a71c0de4143c3be5d5c5ccd1ad2c0",
        "usr-x86-verity-sig",
        Role::UsrVeritySig,
        Some("x86"),
    ),
    t(
        b"4f68bce3e8cd4db196e7fbcaf984b709",
        "root-x86-64",
        Role::Root,
        Some("x86-64"),
    ),
    t(
        b"2c7357edebd246d9aec123d437ec2bf5",
        "root-x86-64-verity",
        Role::RootVerity,
        Some("x86-64"),
    ),
    t(
        b"41092b059fc84523994f2def0408b176",
        "root-x86-64-verity-sig",
        Role::RootVeritySig,
        Some("x86-64"),
    ),
    t(
        b"8484680c952148c69c11b0720656f69e",
        "usr-x86-64",
        Role::Usr,
        Some("x86-64"),
    ),
    t(
        b"77ff5f63e7b64633acf41565b864c0e6",
        "usr-x86-64-verity",
        Role::UsrVerity,
        Some("x86-64"),
    ),
    t(
        b"e7bb33fb06cf4e818273e543b413e2e2",
        "usr-x86-64-verity-sig",
        Role::UsrVeritySig,
        Some("x86-64"),
    ),
    t(
        b"69dad7102ce44e3cb16c21a1d49abed3",
        "root-arm",
        Role::Root,
        Some("arm"),
    ),
    t(
        b"7386cdf2203c47a9a498f2ecce45a2d6",
        "root-arm-verity",
        Role::RootVerity,
        Some("arm"),
    ),
    t(
        b"42b0455feb11491d98d356145ba9d037",
        "root-arm-verity-sig",
        Role::RootVeritySig,
        Some("arm"),
    ),
    t(
        b"7d0359a302b34f0a865c654403e70625",
        "usr-arm",
        Role::Usr,
        Some("arm"),
    ),
    t(
        b"c215d7517bcd4649be906627490a4c05",
        "usr-arm-verity",
        Role::UsrVerity,
        Some("arm"),
    ),
    t(
        b"d7ff812f37d14902a810d76ba57b975a",
        "usr-arm-verity-sig",
        Role::UsrVeritySig,
        Some("arm"),
    ),
    t(
        b"b921b0451df041c3af444c6f280d3fae",
        "root-arm64",
        Role::Root,
        Some("arm64"),
    ),
    t(
        b"df3300ced69f4c92978c9bfb0f38d820",
        "root-arm64-verity",
        Role::RootVerity,
        Some("arm64"),
    ),
    t(
        b"6db69de629f44758a7a5962190f00ce3",
        "root-arm64-verity-sig",
        Role::RootVeritySig,
        Some("arm64"),
    ),
    t(
        b"b0e01050ee5f4390949a9101b17104e9",
        "usr-arm64",
        Role::Usr,
        Some("arm64"),
    ),
    t(
        b"6e11a4e7fbca4dedb9e9e1a512bb664e",
        "usr-arm64-verity",
        Role::UsrVerity,
        Some("arm64"),
    ),
    t(
        b"c23ce4ff44bd4b00b2d4b41b3419e02a",
        "usr-arm64-verity-sig",
        Role::UsrVeritySig,
        Some("arm64"),
    ),
    t(
        b"72ec70a6cf7440e6bd494bda08e8f224",
        "root-riscv64",
        Role::Root,
        Some("riscv64"),
    ),
    t(
        b"b6ed5582440b4209b8da5ff7c419ea3d",
        "root-riscv64-verity",
        Role::RootVerity,
        Some("riscv64"),
    ),
    t(
        b"efe0f087ea8d4469821a4c2a96a8386a",
        "root-riscv64-verity-sig",
        Role::RootVeritySig,
        Some("riscv64"),
    ),
    t(
        b"beaec34b8442439ba40b984381ed097d",
        "usr-riscv64",
        Role::Usr,
        Some("riscv64"),
    ),
    t(
        b"8f1056be9b0547c481d6be53128e5b54",
        "usr-riscv64-verity",
        Role::UsrVerity,
        Some("riscv64"),
    ),
    t(
        b"d2f9000a7a18453fb5cd4d32f77a7b32",
        "usr-riscv64-verity-sig",
        Role::UsrVeritySig,
        Some("riscv64"),
    ),
    t(
        b"77055800792c4f94b39a98c91b762bb6",
        "root-loongarch64",
        Role::Root,
        Some("loongarch64"),
    ),
    t(
        b"f3393b22e9af4613a9489d3bfbd0c535",
        "root-loongarch64-verity",
        Role::RootVerity,
        Some("loongarch64"),
    ),
    t(
        b"5afb67ebecc84f85ae8eac1e7c50e7d0",
        "root-loongarch64-verity-sig",
        Role::RootVeritySig,
        Some("loongarch64"),
    ),
    t(
        b"e611c702575c4cbe9a46434fa0bf7e3f",
        "usr-loongarch64",
        Role::Usr,
        Some("loongarch64"),
    ),
    t(
        b"f46b2c2659ae48f09106c50ed47f673d",
        "usr-loongarch64-verity",
        Role::UsrVerity,
        Some("loongarch64"),
    ),
    t(
        b"b024f315d330444c846144bbde524e99",
        "usr-loongarch64-verity-sig",
        Role::UsrVeritySig,
        Some("loongarch64"),
    ),
    t(
        b"c31c45e63f39412e80fb4809c4980599",
        "root-ppc64-le",
        Role::Root,
        Some("ppc64-le"),
    ),
    t(
        b"906bd94445894aaea4e4dd983917446a",
        "root-ppc64-le-verity",
        Role::RootVerity,
        Some("ppc64-le"),
    ),
    t(
        b"d4a236e7e8734c07bf1dbf6cf7f1c3c6",
        "root-ppc64-le-verity-sig",
        Role::RootVeritySig,
        Some("ppc64-le"),
    ),
    t(
        b"15bb03af77e74d4ab12bc0d084f7491c",
        "usr-ppc64-le",
        Role::Usr,
        Some("ppc64-le"),
    ),
    t(
        b"ee2b998321e8415386d9b6901a54d1ce",
        "usr-ppc64-le-verity",
        Role::UsrVerity,
        Some("ppc64-le"),
    ),
    t(
        b"c8bfbd1e268e45218bbabf314c399557",
        "usr-ppc64-le-verity-sig",
        Role::UsrVeritySig,
        Some("ppc64-le"),
    ),
    t(
        b"5eead9a9fe094a1ea1d7520d00531306",
        "root-s390x",
        Role::Root,
        Some("s390x"),
    ),
    t(
        b"b325bfbec7be4ab88357139e652d2f6b",
        "root-s390x-verity",
        Role::RootVerity,
        Some("s390x"),
    ),
    t(
        b"c80187a573a3491a901a017c3fa953e9",
        "root-s390x-verity-sig",
        Role::RootVeritySig,
        Some("s390x"),
    ),
    t(
        b"8a4f577050aa4ed3874a99b710db6fea",
        "usr-s390x",
        Role::Usr,
        Some("s390x"),
    ),
    t(
        b"31741cc41a2a4111a581e00b447d2d06",
        "usr-s390x-verity",
        Role::UsrVerity,
        Some("s390x"),
    ),
    t(
        b"3f324816667b46ae86ee9b0c0c6c11b4",
        "usr-s390x-verity-sig",
        Role::UsrVeritySig,
        Some("s390x"),
    ),
    t(b"c12a7328f81f11d2ba4b00a0c93ec93b", "esp", Role::Esp, None),
];

const fn t(
    guid: &[u8; 32],
    name: &'static str,
    role: Role,
    arch: Option<&'static str>,
) -> PartType {
    PartType {
        guid: g(guid),
        name,
        role,
        arch,
    }
}

/// The architecture dmkit runs on, as systemd names it (`None` where [`KNOWN`] has none).
pub fn native_architecture() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86" => Some("x86"),
        "x86_64" => Some("x86-64"),
        "arm" => Some("arm"),
        "aarch64" => Some("arm64"),
        "riscv64" => Some("riscv64"),
        "loongarch64" => Some("loongarch64"),
        "powerpc64" if cfg!(target_endian = "little") => Some("ppc64-le"),
        "s390x" => Some("s390x"),
        _ => None,
    }
}
