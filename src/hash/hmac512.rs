//! HMAC-SHA-512 from the key's pad states: `key ^ 0x36` and `key ^ 0x5c` are compressed once
//! per key, so a tag costs its own blocks and one outer compression (not three more), and
//! the key is not hashed again per sector. One message at a time through the `sha2` crate's
//! block function (SHA-512 has no multi-lane engine here).

use sha2::digest::generic_array::GenericArray;

/// SHA-512's initial chaining value.
const IV: [u64; 8] = [
    0x6a09_e667_f3bc_c908,
    0xbb67_ae85_84ca_a73b,
    0x3c6e_f372_fe94_f82b,
    0xa54f_f53a_5f1d_36f1,
    0x510e_527f_ade6_82d1,
    0x9b05_688c_2b3e_6c1f,
    0x1f83_d9ab_fb41_bd6b,
    0x5be0_cd19_137e_2179,
];

fn compress(state: &mut [u64; 8], block: &[u8]) {
    sha2::compress512(state, &[*GenericArray::from_slice(block)]);
}

/// The chaining values of an HMAC-SHA-512 key after its inner and outer pad blocks.
#[derive(Clone)]
pub struct HmacSha512State {
    inner: [u64; 8],
    outer: [u64; 8],
}

impl HmacSha512State {
    /// The states of `key` (a key longer than 128 bytes is hashed first, as RFC 2104 and the
    /// kernel's `hmac()` do).
    pub fn new(key: &[u8]) -> HmacSha512State {
        use sha2::Digest;
        let digest = |k: &[u8]| zeroize::Zeroizing::new(sha2::Sha512::digest(k).to_vec());
        let (mut inner, mut outer) = (IV, IV);
        compress(
            &mut inner,
            &super::md::key_pad::<128>(key, digest, 0x36)[..],
        );
        compress(
            &mut outer,
            &super::md::key_pad::<128>(key, digest, 0x5c)[..],
        );
        HmacSha512State { inner, outer }
    }

    /// The HMAC of the concatenation of `parts`.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 64] {
        let mut st = self.inner;
        super::md::feed::<128>(parts, 128, 16, |b| compress(&mut st, b));
        // The outer message: the inner digest after the 128-byte pad.
        let mut digest = [0u8; 64];
        for (c, w) in digest.chunks_exact_mut(8).zip(&st) {
            c.copy_from_slice(&w.to_be_bytes());
        }
        let mut o = self.outer;
        super::md::feed::<128>(&[&digest], 128, 16, |b| compress(&mut o, b));
        let mut out = [0u8; 64];
        for (c, w) in out.chunks_exact_mut(8).zip(&o) {
            c.copy_from_slice(&w.to_be_bytes());
        }
        out
    }
}

impl Drop for HmacSha512State {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.inner.zeroize();
        self.outer.zeroize();
    }
}

impl std::fmt::Debug for HmacSha512State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacSha512State(<secret>)")
    }
}

#[cfg(test)]
mod tests {
    use super::super::sha256_lanes::tests::openssl_hmac;
    use super::*;

    /// RFC 4231 case 2 and 6 (a key longer than the block), then random keys and split
    /// messages of every length class against OpenSSL.
    #[test]
    fn matches_rfc4231_and_openssl() {
        assert_eq!(
            hex::encode(HmacSha512State::new(b"Jefe").mac(&[b"what do ya ", b"want for nothing?"])),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a\
             6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
        assert_eq!(
            hex::encode(
                HmacSha512State::new(&[0xaa; 131])
                    .mac(&[b"Test Using Larger Than Block-Size Key - Hash Key First"])
            ),
            "80b24263c7c1a3ebb71493c1dd7be8b49b46d1f41b4aeec1121b013783f8f3526b56d037e05f2598\
             bd0fd2215d6a1e5295e64f73f63f0aec8b915a985d786598"
        );
        let mut seed = 7;
        let mut rnd = |n: usize| {
            seed += 1;
            super::super::tests::random_bytes(n, seed)
        };
        for (klen, plen, blen) in [
            (1, 8, 512),
            (64, 24, 4096),
            (128, 0, 111),
            (129, 16, 112),
            (200, 3, 0),
            (33, 40, 240),
        ] {
            let (key, p, b) = (rnd(klen), rnd(plen), rnd(blen + 3));
            let b = &b[3..];
            assert_eq!(
                HmacSha512State::new(&key).mac(&[&p, b])[..],
                openssl_hmac(openssl::hash::MessageDigest::sha512(), &key, &[&p, b])[..],
                "key {klen} prefix {plen} body {blen}"
            );
        }
    }
}
