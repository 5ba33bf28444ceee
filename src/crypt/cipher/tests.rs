//! Known-answer tests (IEEE 1619 XTS-AES vectors) and cross-checks of every implementation
//! (VAES, OpenSSL, and our portable XTS/CBC over RustCrypto's AES) against OpenSSL's EVP on
//! random data, for every IV mode and sector sizes 512..4096.

use super::{
    new_sector_cipher, new_sector_cipher_with, vaes512_available, CipherImpl, CipherSpec,
    SectorCipher,
};
use openssl::symm::{Cipher, Crypter, Mode};

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

fn random(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    getrandom::getrandom(&mut v).unwrap();
    v
}

/// The implementations runnable here.
fn impls() -> Vec<CipherImpl> {
    let mut v = vec![CipherImpl::OpenSsl, CipherImpl::Portable];
    if vaes512_available() {
        v.push(CipherImpl::Vaes512);
    } else {
        eprintln!("note: no VAES/AVX-512 on this CPU; only the OpenSSL implementation is tested");
    }
    v
}

fn make(spec: &str, key: &[u8], imp: CipherImpl) -> Box<dyn SectorCipher> {
    new_sector_cipher_with(&CipherSpec::parse(spec).unwrap(), key, imp).unwrap()
}

/// IEEE 1619-2007 vectors 1, 2, 4, 5 (AES-128) and 10 (AES-256); the data unit sequence
/// number is dm-crypt's plain64 IV.
#[test]
fn ieee1619_vectors() {
    let pt512: Vec<u8> = (0..512).map(|i| i as u8).collect();
    let v10 = "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd5776926c49a3095eb108fd1098baec70aaa66999a72a82f27d848b21d4a741b0c5cd4d5fff9dac89aeba122961d03a757123e9870f8acf1000020887891429ca2a3e7a7d7df7b10355165c8b9a6d0a7de8b062c4500dc4cd120c0f7418dae3d0b5781c34803fa75421c790dfe1de1834f280d7667b327f6c8cd7557e12ac3a0f93ec05c52e0493ef31a12d3d9260f79a289d6a379bc70c50841473d1a8cc81ec583e9645e07b8d9670655ba5bbcfecc6dc3966380ad8fecb17b6ba02469a020a84e18e8f84252070c13e9f1f289be54fbc481457778f616015e1327a02b140f1505eb309326d68378f8374595c849d84f4c333ec4423885143cb47bd71c5edae9be69a2ffeceb1bec9de244fbe15992b11b77c040f12bd8f6a975a44a0f90c29a9abc3d4d893927284c58754cce294529f8614dcd2aba991925fedc4ae74ffac6e333b93eb4aff0479da9a410e4450e0dd7ae4c6e2910900575da401fc07059f645e8b7e9bfdef33943054ff84011493c27b3429eaedb4ed5376441a77ed43851ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151";
    let v4 = "27a7479befa1d476489f308cd4cfa6e2a96e4bbe3208ff25287dd3819616e89cc78cf7f5e543445f8333d8fa7f56000005279fa5d8b5e4ad40e736ddb4d35412328063fd2aab53e5ea1e0a9f332500a5df9487d07a5c92cc512c8866c7e860ce93fdf166a24912b422976146ae20ce846bb7dc9ba94a767aaef20c0d61ad02655ea92dc4c4e41a8952c651d33174be51a10c421110e6d81588ede82103a252d8a750e8768defffed9122810aaeb99f9172af82b604dc4b8e51bcb08235a6f4341332e4ca60482a4ba1a03b3e65008fc5da76b70bf1690db4eae29c5f1badd03c5ccf2a55d705ddcd86d449511ceb7ec30bf12b1fa35b913f9f747a8afd1b130e94bff94effd01a91735ca1726acd0b197c4e5b03393697e126826fb6bbde8ecc1e08298516e2c9ed03ff3c1b7860f6de76d4cecd94c8119855ef5297ca67e9f3e7ff72b1e99785ca0a7e7720c5b36dc6d72cac9574c8cbbc2f801e23e56fd344b07f22154beba0f08ce8891e643ed995c94d9a69c9f1b5f499027a78572aeebd74d20cc39881c213ee770b1010e4bea718846977ae119f7a023ab58cca0ad752afe656bb3c17256a9f6e9bf19fdd5a38fc82bbe872c5539edb609ef4f79c203ebb140f2e583cb2ad15b4aa5b655016a8449277dbd477ef2c8d6c017db738b18deb4a427d1923ce3ff262735779a418f20a282df920147beabe421ee5319d0568";
    assert_eq!(v10.len(), 1024);
    assert_eq!(v4.len(), 1024);
    // (key, data unit number, plaintext, ciphertext)
    type Vector = (Vec<u8>, u64, Vec<u8>, Vec<u8>);
    let cases: Vec<Vector> = vec![
        (
            vec![0u8; 32],
            0,
            vec![0u8; 32],
            unhex("917cf69ebd68b2ec9b9fe9a3eadda692cd43d2f59598ed858c02c2652fbf922e"),
        ),
        (
            unhex("1111111111111111111111111111111122222222222222222222222222222222"),
            0x3333333333,
            vec![0x44u8; 32],
            unhex("c454185e6a16936e39334038acef838bfb186fff7480adc4289382ecd6d394f0"),
        ),
        (
            unhex("fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0bfbebdbcbbbab9b8b7b6b5b4b3b2b1b0"),
            0x123456789a,
            vec![0x44u8; 32],
            unhex("b01f86f8edc1863706fa8a4253e34f28af319de38334870f4dd1f94cbe9832f1"),
        ),
        (
            unhex("2718281828459045235360287471352631415926535897932384626433832795"),
            0,
            pt512.clone(),
            unhex(v4),
        ),
        (
            unhex(
                "27182818284590452353602874713526624977572470936999595749669676273141592653589793238462643383279502884197169399375105820974944592",
            ),
            0xff,
            pt512,
            unhex(v10),
        ),
    ];
    for (n, (key, dun, pt, ct)) in cases.iter().enumerate() {
        for imp in impls() {
            // OpenSSL refuses identical XTS halves (vector 1); the kernel and we accept them.
            if imp == CipherImpl::OpenSsl && key[..key.len() / 2] == key[key.len() / 2..] {
                continue;
            }
            let c = make("aes-xts-plain64", key, imp);
            let mut buf = pt.clone();
            c.encrypt(&mut buf, *dun, pt.len());
            assert_eq!(hex::encode(&buf), hex::encode(ct), "vector #{n} {imp:?}");
            c.decrypt(&mut buf, *dun, pt.len());
            assert_eq!(&buf, pt, "vector #{n} {imp:?} decrypt");
        }
    }
}

/// dm-crypt's IV of `sector`, written independently of the library.
fn reference_iv(ivmode: &str, key: &[u8], sector: u64) -> [u8; 16] {
    let mut iv = [0u8; 16];
    match ivmode {
        "plain64" => iv[..8].copy_from_slice(&sector.to_le_bytes()),
        "plain" => iv[..4].copy_from_slice(&(sector as u32).to_le_bytes()),
        "plain64be" => iv[8..].copy_from_slice(&sector.to_be_bytes()),
        "benbi" => iv[8..].copy_from_slice(&((sector << 5) + 1).to_be_bytes()),
        "null" => {}
        "essiv:sha256" => {
            use sha2::Digest;
            let salt = sha2::Sha256::digest(key);
            iv[..8].copy_from_slice(&sector.to_le_bytes());
            let mut c = Crypter::new(Cipher::aes_256_ecb(), Mode::Encrypt, &salt, None).unwrap();
            c.pad(false);
            let mut out = [0u8; 32];
            c.update(&iv, &mut out).unwrap();
            iv.copy_from_slice(&out[..16]);
        }
        m => panic!("no reference for {m}"),
    }
    iv
}

fn openssl_cipher(mode: &str, key_len: usize) -> Cipher {
    match (mode, key_len) {
        ("xts", 32) => Cipher::aes_128_xts(),
        ("xts", 64) => Cipher::aes_256_xts(),
        ("cbc", 16) => Cipher::aes_128_cbc(),
        ("cbc", 24) => Cipher::aes_192_cbc(),
        ("cbc", 32) => Cipher::aes_256_cbc(),
        _ => unreachable!(),
    }
}

/// Encrypt `data` sector by sector with OpenSSL's one-shot API, as dm-crypt would.
fn reference(
    mode: &str,
    ivmode: &str,
    key: &[u8],
    data: &[u8],
    first: u64,
    ss: usize,
    enc: bool,
) -> Vec<u8> {
    let cipher = openssl_cipher(mode, key.len());
    let mut out = Vec::with_capacity(data.len());
    for (i, s) in data.chunks(ss).enumerate() {
        let iv = reference_iv(ivmode, key, first + i as u64);
        let m = if enc { Mode::Encrypt } else { Mode::Decrypt };
        let mut c = Crypter::new(cipher, m, key, Some(&iv)).unwrap();
        c.pad(false);
        let mut o = vec![0u8; ss + 32];
        let n = c.update(s, &mut o).unwrap();
        let f = c.finalize(&mut o[n..]).unwrap();
        assert_eq!(n + f, ss);
        out.extend_from_slice(&o[..ss]);
    }
    out
}

#[test]
fn every_iv_mode_and_sector_size_matches_openssl() {
    let combos: &[(&str, &[usize])] = &[
        ("aes-xts-plain64", &[32, 64]),
        ("aes-xts-plain", &[32, 64]),
        ("aes-xts-plain64be", &[64]),
        ("aes-xts-benbi", &[64]),
        ("aes-xts-essiv:sha256", &[64]),
        ("aes-cbc-essiv:sha256", &[16, 24, 32]),
        ("aes-cbc-plain64", &[32]),
        ("aes-cbc-plain", &[16]),
        ("aes-cbc-null", &[32]),
    ];
    for &(spec, key_sizes) in combos {
        let parsed = CipherSpec::parse(spec).unwrap();
        let ivmode = match &parsed.iv_opt {
            Some(o) => format!("{}:{o}", parsed.iv),
            None => parsed.iv.clone(),
        };
        for &kl in key_sizes {
            let key = random(kl);
            for ss in [512usize, 1024, 2048, 4096] {
                let data = random(ss * 5);
                // Around the 32-bit wrap, so "plain" truncation shows.
                for first in [0u64, 7, 0xffff_fffe, 0x1_2345_6789] {
                    let want = reference(&parsed.mode, &ivmode, &key, &data, first, ss, true);
                    for imp in impls() {
                        if imp == CipherImpl::Vaes512 && parsed.mode != "xts" {
                            continue;
                        }
                        let c = make(spec, &key, imp);
                        let mut buf = data.clone();
                        c.encrypt(&mut buf, first, ss);
                        assert!(
                            buf == want,
                            "{spec} {}-bit {imp:?} ss {ss} first {first}: encryption differs from OpenSSL",
                            kl * 8
                        );
                        c.decrypt(&mut buf, first, ss);
                        assert!(buf == data, "{spec} {imp:?} ss {ss}: decryption");
                        // And decrypting OpenSSL's ciphertext.
                        let mut x = want.clone();
                        c.decrypt(&mut x, first, ss);
                        assert!(x == data, "{spec} {imp:?} ss {ss}: decrypt of OpenSSL data");
                    }
                }
            }
        }
    }
}

#[test]
fn decrypt_reference_agrees() {
    // Sanity of the reference itself: OpenSSL decrypt of OpenSSL encrypt.
    let key = random(64);
    let data = random(4096 * 2);
    let ct = reference("xts", "plain64", &key, &data, 3, 4096, true);
    assert_eq!(reference("xts", "plain64", &key, &ct, 3, 4096, false), data);
}

#[test]
fn vaes_handles_odd_lengths_and_sectors_one_call_or_many() {
    if !vaes512_available() {
        return;
    }
    let key = random(64);
    let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
    let v = new_sector_cipher_with(&spec, &key, CipherImpl::Vaes512).unwrap();
    let o = new_sector_cipher_with(&spec, &key, CipherImpl::OpenSsl).unwrap();
    // Sector sizes that are not multiples of 256 bytes exercise the one-block tail.
    for ss in [16usize, 48, 272, 528, 4096 + 16 * 7] {
        let data = random(ss * 3);
        let (mut a, mut b) = (data.clone(), data.clone());
        v.encrypt(&mut a, 99, ss);
        o.encrypt(&mut b, 99, ss);
        assert_eq!(a, b, "ss {ss}");
        v.decrypt(&mut a, 99, ss);
        assert_eq!(a, data);
    }
    // Many sectors in one call equal one call per sector.
    let data = random(4096 * 8);
    let mut a = data.clone();
    v.encrypt(&mut a, 1000, 4096);
    let mut b = data.clone();
    for (i, s) in b.chunks_mut(4096).enumerate() {
        v.encrypt(s, 1000 + i as u64, 4096);
    }
    assert_eq!(a, b);
}

/// The VAES path takes the tweaks of four sectors at once: every count of sectors around
/// that group (with and without a partial last group), every IV generator it serves, both key
/// sizes, sector numbers where plain64 wraps at 2^64 and plain at 2^32, and buffers at odd
/// addresses, against the portable XTS (itself checked against OpenSSL above).
#[test]
fn vaes_tweak_groups_match_the_portable_xts_for_every_count_in_and_out_of_place() {
    if !vaes512_available() {
        return;
    }
    for spec in [
        "aes-xts-plain64",
        "aes-xts-plain",
        "aes-xts-essiv:sha256",
        "aes-xts-benbi",
    ] {
        let spec = CipherSpec::parse(spec).unwrap();
        for kl in [32usize, 64] {
            let key = random(kl);
            let v = new_sector_cipher_with(&spec, &key, CipherImpl::Vaes512).unwrap();
            let o = new_sector_cipher_with(&spec, &key, CipherImpl::Portable).unwrap();
            for ss in [512usize, 4096] {
                for n in 1..=9 {
                    let cases = [(0u64, 0usize), (5, 1), (0xffff_fffd, 3), (u64::MAX - 2, 0)];
                    for (first, skew) in cases {
                        let data = random(ss * n);
                        // The VAES buffer at an odd address where `skew` says so.
                        let mut a = vec![0u8; ss * n + skew];
                        a[skew..].copy_from_slice(&data);
                        let mut b = data.clone();
                        let at = format!("{spec} {kl} ss {ss} n {n} first {first} skew {skew}");
                        v.encrypt(&mut a[skew..], first, ss);
                        o.encrypt(&mut b, first, ss);
                        assert!(a[skew..] == b[..], "{at}");
                        // Out of place, the source and the destination each at its own
                        // odd address: the same ciphertext, the source untouched.
                        let mut src = vec![0u8; ss * n + 3];
                        src[3..].copy_from_slice(&data);
                        let mut dst = vec![0u8; ss * n + skew + 1];
                        v.encrypt_to(&src[3..], &mut dst[skew + 1..], first, ss);
                        assert!(dst[skew + 1..] == b[..], "{at}: encrypt_to");
                        assert!(src[3..] == data[..], "{at}: encrypt_to changed its source");
                        let mut c = vec![0u8; ss * n];
                        o.encrypt_to(&data, &mut c, first, ss);
                        assert!(c == b, "{at}: the default encrypt_to");
                        v.decrypt(&mut a[skew..], first, ss);
                        assert!(a[skew..] == data[..], "{at}: decrypt");
                    }
                }
            }
        }
    }
}

#[test]
fn auto_picks_the_fast_path_and_is_thread_safe() {
    let key = random(64);
    let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
    let c = std::sync::Arc::new(new_sector_cipher(&spec, &key).unwrap());
    if vaes512_available() {
        assert_eq!(c.implementation(), "vaes-avx512");
    }
    assert_eq!(c.key_size(), 64);
    let data = random(4096 * 4);
    let want = reference("xts", "plain64", &key, &data, 42, 4096, true);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let c = c.clone();
            let (data, want) = (&data, &want);
            s.spawn(move || {
                for _ in 0..50 {
                    let mut b = data.clone();
                    c.encrypt(&mut b, 42, 4096);
                    assert!(&b == want);
                }
            });
        }
    });
    // The CBC pool under concurrency.
    let cbc = std::sync::Arc::new(
        new_sector_cipher(
            &CipherSpec::parse("aes-cbc-essiv:sha256").unwrap(),
            &key[..32],
        )
        .unwrap(),
    );
    let want = reference("cbc", "essiv:sha256", &key[..32], &data, 5, 512, true);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let c = cbc.clone();
            let (data, want) = (&data, &want);
            s.spawn(move || {
                for _ in 0..20 {
                    let mut b = data.clone();
                    c.encrypt(&mut b, 5, 512);
                    assert!(&b == want);
                }
            });
        }
    });
}

#[test]
fn openssl_refuses_identical_xts_halves_clearly() {
    let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
    let e = new_sector_cipher_with(&spec, &[5u8; 64], CipherImpl::OpenSsl)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("identical"), "{e}");
    if !vaes512_available() {
        let e = new_sector_cipher_with(&spec, &[5u8; 64], CipherImpl::Vaes512)
            .err()
            .unwrap();
        assert!(e.to_string().contains("not available"));
    }
}
