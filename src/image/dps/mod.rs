//! The Discoverable Partitions Specification as systemd applies it: partition type GUIDs,
//! their labels, and how every identifier of an image derives from its seed.
//!
//! - Verity data and hash partitions: their UUIDs are the first and the last 128 bits of the
//!   root hash, so the root hash finds its partitions (and a reader can check that it did).
//! - Everything else comes from a 128-bit seed through HMAC-SHA-256, keyed by the seed:
//!   the disk GUID (`"disk-uuid"`), the UUID of each other partition (the type GUID as the
//!   message), the file system UUID (`"file-system-uuid"`, keyed by the partition's seeded
//!   UUID), the verity salt (`"verity-salt"`, all 32 bytes) and the verity superblock UUID
//!   (`"verity-uuid"`). Derived UUIDs are marked as version 4.
//!
//! Debian 12's systemd-repart (252) derives the disk GUID and the signature partition's UUID
//! this way (the test below and tests/image.rs check it with the same seed), but takes a
//! random verity salt and superblock UUID, so its images of one tree differ from build to
//! build; ours derive those from the seed too, which makes the whole image reproducible.

use super::gpt::Guid;
use crate::hash::hmac_sha256;

/// What a partition is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The root file system.
    Root,
    /// Its dm-verity hash tree.
    RootVerity,
    /// The signature of its root hash (JSON).
    RootVeritySig,
    /// The /usr file system.
    Usr,
    /// Its dm-verity hash tree.
    UsrVerity,
    /// The signature of its root hash.
    UsrVeritySig,
    /// The EFI system partition.
    Esp,
}

impl Role {
    /// The verity hash partition's role for a file system role (`None` for the others).
    pub fn verity(self) -> Option<Role> {
        match self {
            Role::Root => Some(Role::RootVerity),
            Role::Usr => Some(Role::UsrVerity),
            _ => None,
        }
    }

    /// The verity signature partition's role for a file system role (`None` for the others).
    pub fn verity_sig(self) -> Option<Role> {
        match self {
            Role::Root => Some(Role::RootVeritySig),
            Role::Usr => Some(Role::UsrVeritySig),
            _ => None,
        }
    }
}

/// A known partition type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartType {
    /// The type GUID, text order.
    pub guid: Guid,
    /// systemd's name, which systemd-repart also uses as the default label.
    pub name: &'static str,
    /// Its role.
    pub role: Role,
    /// The architecture it is for, as systemd spells it (`None`: any).
    pub arch: Option<&'static str>,
}

const fn g(s: &[u8; 32]) -> Guid {
    const fn nib(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("not lowercase hex"),
        }
    }
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = nib(s[2 * i]) << 4 | nib(s[2 * i + 1]);
        i += 1;
    }
    out
}

/// Root partition, x86-64.
pub const ROOT_X86_64: PartType = PartType {
    guid: g(b"4f68bce3e8cd4db196e7fbcaf984b709"),
    name: "root-x86-64",
    role: Role::Root,
    arch: Some("x86-64"),
};
/// Root verity partition, x86-64.
pub const ROOT_X86_64_VERITY: PartType = PartType {
    guid: g(b"2c7357edebd246d9aec123d437ec2bf5"),
    name: "root-x86-64-verity",
    role: Role::RootVerity,
    arch: Some("x86-64"),
};
/// Root verity signature partition, x86-64.
pub const ROOT_X86_64_VERITY_SIG: PartType = PartType {
    guid: g(b"41092b059fc84523994f2def0408b176"),
    name: "root-x86-64-verity-sig",
    role: Role::RootVeritySig,
    arch: Some("x86-64"),
};

mod types;
pub use types::{native_architecture, ARCHITECTURES, KNOWN};

/// The known type of a type GUID.
pub fn lookup(type_guid: &Guid) -> Option<&'static PartType> {
    KNOWN.iter().find(|t| t.guid == *type_guid)
}

/// The type of `role` for architecture `arch` (as systemd spells it: `x86-64`, `arm64`...).
pub fn find(arch: &str, role: Role) -> Option<&'static PartType> {
    KNOWN
        .iter()
        .find(|t| t.role == role && t.arch == Some(arch))
}

/// Mark 16 bytes as a random (version 4, RFC 4122 variant) UUID, as systemd's
/// `id128_make_v4_uuid`.
pub fn make_v4(mut u: Guid) -> Guid {
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

fn first_half(d: [u8; 32]) -> Guid {
    d[..16].try_into().expect("16 bytes")
}

/// systemd-repart's `derive_uuid`: HMAC-SHA-256 of `token` keyed by `base`, first half, v4.
pub fn derive_uuid(base: &Guid, token: &str) -> Guid {
    make_v4(first_half(hmac_sha256(base, token.as_bytes())))
}

/// systemd-repart's `partition_acquire_uuid` for the first partition of a type: HMAC-SHA-256
/// of the type GUID keyed by the seed, first half, v4.
pub fn seeded_partition_uuid(seed: &Guid, type_guid: &Guid) -> Guid {
    make_v4(first_half(hmac_sha256(seed, type_guid)))
}

/// The UUIDs of the verity data and hash partitions: the first and last 128 bits of the root
/// hash (which must be at least 32 bytes).
pub fn verity_partition_uuids(root_hash: &[u8]) -> Option<(Guid, Guid)> {
    if root_hash.len() < 32 {
        return None;
    }
    let data = root_hash[..16].try_into().ok()?;
    let hash = root_hash[root_hash.len() - 16..].try_into().ok()?;
    Some((data, hash))
}

/// Every identifier of an image, derived from its seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    /// The seed.
    pub seed: Guid,
    /// Disk GUID.
    pub disk: Guid,
    /// UUID of the root file system.
    pub fs_uuid: Guid,
    /// UUID of the verity signature partition.
    pub sig_partition: Guid,
    /// Verity salt.
    pub verity_salt: [u8; 32],
    /// UUID in the verity superblock.
    pub verity_uuid: Guid,
}

impl Ids {
    /// Derive every identifier from `seed` for a root-x86-64, root-x86-64-verity and
    /// root-x86-64-verity-sig partition set (see the module's notes on what systemd-repart 252
    /// derives alike).
    pub fn derive(seed: &Guid) -> Ids {
        Ids::derive_for(seed, &ROOT_X86_64, &ROOT_X86_64_VERITY_SIG)
    }

    /// Derive every identifier from `seed` for a file system partition of type `data` and its
    /// signature partition of type `sig`.
    pub fn derive_for(seed: &Guid, data: &PartType, sig: &PartType) -> Ids {
        let data_seeded = seeded_partition_uuid(seed, &data.guid);
        Ids {
            seed: *seed,
            disk: derive_uuid(seed, "disk-uuid"),
            fs_uuid: derive_uuid(&data_seeded, "file-system-uuid"),
            sig_partition: seeded_partition_uuid(seed, &sig.guid),
            verity_salt: hmac_sha256(seed, b"verity-salt"),
            verity_uuid: derive_uuid(seed, "verity-uuid"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verity::superblock::{format_uuid, parse_uuid};

    #[test]
    fn matches_systemd_repart_252() {
        // Debian 12's systemd-repart with --seed=b9a72bf2-5f5c-4a5e-9e3c-1d2e3f405162 wrote
        // this disk GUID and this UUID for the root-x86-64-verity-sig partition.
        let seed = parse_uuid("b9a72bf2-5f5c-4a5e-9e3c-1d2e3f405162").unwrap();
        let ids = Ids::derive(&seed);
        assert_eq!(
            format_uuid(&ids.disk),
            "a716d9c2-f2e5-4feb-a3ee-cc7d617666b4"
        );
        assert_eq!(
            format_uuid(&ids.sig_partition),
            "4436c663-1301-4dc8-a287-60fd32c3a65e"
        );
        // And the root hash it printed gave the two verity partitions their UUIDs.
        let rh = hex::decode("a950a8d8919a27fbf240a725d9842a4fc7cf4a4032cf5f2e43c16a1d5a418334")
            .unwrap();
        let (d, h) = verity_partition_uuids(&rh).unwrap();
        assert_eq!(format_uuid(&d), "a950a8d8-919a-27fb-f240-a725d9842a4f");
        assert_eq!(format_uuid(&h), "c7cf4a40-32cf-5f2e-43c1-6a1d5a418334");
    }

    #[test]
    fn the_x86_64_constants_are_in_the_table() {
        for c in [ROOT_X86_64, ROOT_X86_64_VERITY, ROOT_X86_64_VERITY_SIG] {
            assert_eq!(find("x86-64", c.role), Some(&c));
        }
        assert_eq!(
            find("arm64", Role::UsrVeritySig).unwrap().name,
            "usr-arm64-verity-sig"
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(native_architecture(), Some("x86-64"));
    }

    #[test]
    fn type_names() {
        assert_eq!(lookup(&ROOT_X86_64.guid).unwrap().name, "root-x86-64");
        assert!(lookup(&[0; 16]).is_none());
        assert_eq!(
            format_uuid(&ROOT_X86_64_VERITY.guid),
            "2c7357ed-ebd2-46d9-aec1-23d437ec2bf5"
        );
    }
}
