//! The Twofish rounds over sixteen blocks in AVX-512 lanes (one block per 32-bit lane), written
//! once for both sixteen-block backends: each brings its own g function (gathers over the keyed
//! tables, or byte permutes and GFNI) and its own tables; the rounds, the key XORs and the XTS
//! loop around them are the same, and are the portable code's, lane by lane.

/// Defines `add`, `key`, `encrypt_words`, `decrypt_words`, `encrypt`, `decrypt` and `xts` in the
/// invoking module. It gives the target features of the rounds and of XTS, the type of its
/// tables and how a schedule `s` gives them; it provides `V` (`__m512i`), `g(&Tables, V) -> V`
/// and imports `lanes512`'s loads, stores and tweaks.
macro_rules! rounds16 {
    (features: $f:literal, xts_features: $fx:literal, tables: $T:ty, |$s:ident| $tables:expr) => {
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn add(a: V, b: V) -> V {
            _mm512_add_epi32(a, b)
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        fn key(k: u32) -> V {
            _mm512_set1_epi32(k as i32)
        }

        /// The sixteen blocks' words (lane order) encrypted.
        #[inline]
        #[target_feature(enable = $f)]
        fn encrypt_words(k: &[u32; 40], t: &$T, w: [V; 4]) -> [V; 4] {
            let mut p: [V; 4] = std::array::from_fn(|i| _mm512_xor_si512(w[i], key(k[i])));
            for r in 0..8 {
                let k = &k[8 + 4 * r..12 + 4 * r];
                let t1 = g(t, _mm512_rol_epi32::<8>(p[1]));
                let t0 = add(g(t, p[0]), t1);
                p[2] = _mm512_ror_epi32::<1>(_mm512_xor_si512(p[2], add(t0, key(k[0]))));
                p[3] = _mm512_xor_si512(_mm512_rol_epi32::<1>(p[3]), add(add(t0, t1), key(k[1])));
                let t1 = g(t, _mm512_rol_epi32::<8>(p[3]));
                let t0 = add(g(t, p[2]), t1);
                p[0] = _mm512_ror_epi32::<1>(_mm512_xor_si512(p[0], add(t0, key(k[2]))));
                p[1] = _mm512_xor_si512(_mm512_rol_epi32::<1>(p[1]), add(add(t0, t1), key(k[3])));
            }
            let out = [p[2], p[3], p[0], p[1]];
            std::array::from_fn(|i| _mm512_xor_si512(out[i], key(k[4 + i])))
        }

        /// The sixteen blocks' words (lane order) decrypted.
        #[inline]
        #[target_feature(enable = $f)]
        fn decrypt_words(k: &[u32; 40], t: &$T, w: [V; 4]) -> [V; 4] {
            let mut c = [
                _mm512_xor_si512(w[2], key(k[6])),
                _mm512_xor_si512(w[3], key(k[7])),
                _mm512_xor_si512(w[0], key(k[4])),
                _mm512_xor_si512(w[1], key(k[5])),
            ];
            for r in (0..8).rev() {
                let k = &k[8 + 4 * r..12 + 4 * r];
                let t1 = g(t, _mm512_rol_epi32::<8>(c[3]));
                let t0 = add(g(t, c[2]), t1);
                c[0] = _mm512_xor_si512(_mm512_rol_epi32::<1>(c[0]), add(t0, key(k[2])));
                c[1] = _mm512_ror_epi32::<1>(_mm512_xor_si512(c[1], add(add(t0, t1), key(k[3]))));
                let t1 = g(t, _mm512_rol_epi32::<8>(c[1]));
                let t0 = add(g(t, c[0]), t1);
                c[2] = _mm512_xor_si512(_mm512_rol_epi32::<1>(c[2]), add(t0, key(k[0])));
                c[3] = _mm512_ror_epi32::<1>(_mm512_xor_si512(c[3], add(add(t0, t1), key(k[1]))));
            }
            std::array::from_fn(|i| _mm512_xor_si512(c[i], key(k[i])))
        }

        /// Encrypt sixteen blocks in place.
        #[target_feature(enable = $f)]
        pub(super) fn encrypt($s: &Schedule, b: &mut [[u8; 16]; 16]) {
            let t: &$T = &$tables;
            store16(encrypt_words(&$s.k, t, load16(b)), b);
        }

        /// Decrypt sixteen blocks in place.
        #[target_feature(enable = $f)]
        pub(super) fn decrypt($s: &Schedule, b: &mut [[u8; 16]; 16]) {
            let t: &$T = &$tables;
            store16(decrypt_words(&$s.k, t, load16(b)), b);
        }

        /// XTS over the whole sixteen-block groups of `blocks` (one sector's run), the first
        /// tweak `first`: the tweak XORs stay in registers around the rounds. Returns the blocks
        /// done.
        #[target_feature(enable = $fx)]
        pub(super) fn xts<const DEC: bool>(
            $s: &Schedule,
            blocks: &mut [[u8; 16]],
            first: u128,
        ) -> usize {
            let t: &$T = &$tables;
            let (groups, _) = blocks.as_chunks_mut::<16>();
            let mut tw = tweaks16(first);
            for b in groups.iter_mut() {
                let w = load16_xor(b, &tw);
                let x = if DEC {
                    decrypt_words(&$s.k, t, w)
                } else {
                    encrypt_words(&$s.k, t, w)
                };
                store16_xor(x, &tw, b);
                tw = next_tweaks16(&tw);
            }
            groups.len() * 16
        }
    };
}

pub(super) use rounds16;
