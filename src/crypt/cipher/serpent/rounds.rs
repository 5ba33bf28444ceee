//! Serpent's 32 rounds written once over "lanes" (a `u32`, or 8 or 16 of them in a vector
//! register), each lane one block, the four words of the blocks in four values (bitslice
//! order: lane j of `x[w]` is word `w` of block j).
//!
//! The macros expand inside a backend module, which provides the value type `V` and `splat`,
//! `xor`, `xor3`, `tern::<IMM>` (a 3-input function as a `vpternlogd` immediate), `mux`,
//! `rotl::<L, R>` (R = 32 - L) and `shl::<L>`. Writing the rounds once keeps the backends to
//! their primitives; S-box indices are literals, so every immediate is a constant.

/// `x = S_i(x)` with the tables of `sbox::ENC` (or `sbox::DEC` for the inverse), each output
/// bit in two steps where `sbox::ENC_TWO` (`DEC_TWO`) has a form for it.
macro_rules! sbox {
    ($table:path, $two:path, $i:literal, $x:ident) => {{
        $x = [
            sbox_bit!($table, $two, $i, 0, $x),
            sbox_bit!($table, $two, $i, 1, $x),
            sbox_bit!($table, $two, $i, 2, $x),
            sbox_bit!($table, $two, $i, 3, $x),
        ];
    }};
}

/// Output bit `k` of S-box `i` of `x`: two dependent 3-input functions where the bit has
/// that form, else the two halves by x0..x2 selected by x3. Every choice is a constant, so
/// only one form's operations remain.
macro_rules! sbox_bit {
    ($table:path, $two:path, $i:literal, $k:literal, $x:ident) => {{
        use $table as T;
        use $two as F;
        let [a, b, c, d] = $x;
        match &F[$i][$k] {
            Some(f) => tern::<{ two_imm(&F[$i][$k], false) }>(
                tern::<{ two_imm(&F[$i][$k], true) }>(
                    $x[f.inner[0]],
                    $x[f.inner[1]],
                    $x[f.inner[2]],
                ),
                $x[f.outer[0]],
                $x[f.outer[1]],
            ),
            None => mux(
                d,
                tern::<{ T[$i][$k][1] }>(a, b, c),
                tern::<{ T[$i][$k][0] }>(a, b, c),
            ),
        }
    }};
}

/// The inner (`inner`) or outer immediate of a two-step form (0 where there is none; that
/// arm is never taken).
pub(super) const fn two_imm(f: &Option<super::sbox::Two>, inner: bool) -> i32 {
    match f {
        Some(t) if inner => t.imm1,
        Some(t) => t.imm2,
        None => 0,
    }
}

/// `x ^= k` (a round key, the same for every lane).
macro_rules! key {
    ($x:ident, $k:expr) => {{
        let k: &[u32; 4] = $k;
        $x = [
            xor($x[0], splat(k[0])),
            xor($x[1], splat(k[1])),
            xor($x[2], splat(k[2])),
            xor($x[3], splat(k[3])),
        ];
    }};
}

/// The linear transformation.
macro_rules! lt {
    ($x:ident) => {{
        let [mut x0, mut x1, mut x2, mut x3] = $x;
        x0 = rotl::<13, 19>(x0);
        x2 = rotl::<3, 29>(x2);
        x1 = xor3(x1, x0, x2);
        x3 = xor3(x3, x2, shl::<3>(x0));
        x1 = rotl::<1, 31>(x1);
        x3 = rotl::<7, 25>(x3);
        x0 = xor3(x0, x1, x3);
        x2 = xor3(x2, x3, shl::<7>(x1));
        x0 = rotl::<5, 27>(x0);
        x2 = rotl::<22, 10>(x2);
        $x = [x0, x1, x2, x3];
    }};
}

/// The inverse linear transformation.
macro_rules! inverse_lt {
    ($x:ident) => {{
        let [mut x0, mut x1, mut x2, mut x3] = $x;
        x2 = rotl::<10, 22>(x2);
        x0 = rotl::<27, 5>(x0);
        x2 = xor3(x2, x3, shl::<7>(x1));
        x0 = xor3(x0, x1, x3);
        x3 = rotl::<25, 7>(x3);
        x1 = rotl::<31, 1>(x1);
        x3 = xor3(x3, x2, shl::<3>(x0));
        x1 = xor3(x1, x0, x2);
        x2 = rotl::<29, 3>(x2);
        x0 = rotl::<19, 13>(x0);
        $x = [x0, x1, x2, x3];
    }};
}

/// Encrypt the lanes of `x` with the 33 round keys `k`.
macro_rules! encrypt_rounds {
    ($x:ident, $k:ident) => {{
        for r in (0..32).step_by(8) {
            key!($x, &$k[r]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 0, $x);
            lt!($x);
            key!($x, &$k[r + 1]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 1, $x);
            lt!($x);
            key!($x, &$k[r + 2]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 2, $x);
            lt!($x);
            key!($x, &$k[r + 3]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 3, $x);
            lt!($x);
            key!($x, &$k[r + 4]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 4, $x);
            lt!($x);
            key!($x, &$k[r + 5]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 5, $x);
            lt!($x);
            key!($x, &$k[r + 6]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 6, $x);
            lt!($x);
            key!($x, &$k[r + 7]);
            sbox!(super::sbox::ENC, super::sbox::ENC_TWO, 7, $x);
            if r < 24 {
                lt!($x);
            }
        }
        key!($x, &$k[32]);
    }};
}

/// Decrypt the lanes of `x` with the 33 round keys `k`.
macro_rules! decrypt_rounds {
    ($x:ident, $k:ident) => {{
        key!($x, &$k[32]);
        for r in (0..32).step_by(8).rev() {
            if r < 24 {
                inverse_lt!($x);
            }
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 7, $x);
            key!($x, &$k[r + 7]);
            inverse_lt!($x);
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 6, $x);
            key!($x, &$k[r + 6]);
            inverse_lt!($x);
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 5, $x);
            key!($x, &$k[r + 5]);
            inverse_lt!($x);
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 4, $x);
            key!($x, &$k[r + 4]);
            inverse_lt!($x);
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 3, $x);
            key!($x, &$k[r + 3]);
            inverse_lt!($x);
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 2, $x);
            key!($x, &$k[r + 2]);
            inverse_lt!($x);
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 1, $x);
            key!($x, &$k[r + 1]);
            inverse_lt!($x);
            sbox!(super::sbox::DEC, super::sbox::DEC_TWO, 0, $x);
            key!($x, &$k[r]);
        }
    }};
}

/// A 3-input boolean function from its `vpternlogd` immediate in and/or/xor gates, for the
/// backends without that instruction: split on the first input, each half a 2-input
/// function. `imm` is a constant at every call, so only its own gates remain.
macro_rules! gates_tern {
    ($(#[$attr:meta])*) => {
        $(#[$attr])*
        fn two(t: i32, b: V, c: V) -> V {
            // Bit (b << 1 | c) of `t` is the function's value.
            match t & 15 {
                0x0 => zero(),
                0xf => not(zero()),
                0xa => c,
                0xc => b,
                0x5 => not(c),
                0x3 => not(b),
                0x6 => xor(b, c),
                0x9 => not(xor(b, c)),
                0x8 => and(b, c),
                0x7 => not(and(b, c)),
                0xe => or(b, c),
                0x1 => not(or(b, c)),
                0x2 => andnot(b, c),
                0x4 => andnot(c, b),
                0xb => not(andnot(c, b)),
                _ => not(andnot(b, c)), // 0xd
            }
        }

        /// The function `IMM` of (a, b, c), as `vpternlogd` defines it.
        $(#[$attr])*
        fn tern<const IMM: i32>(a: V, b: V, c: V) -> V {
            mux(a, two(IMM >> 4, b, c), two(IMM, b, c))
        }

        /// `d ? one : zero`, lane by lane and bit by bit.
        $(#[$attr])*
        fn mux(d: V, one: V, zero: V) -> V {
            or(and(d, one), andnot(d, zero))
        }

        $(#[$attr])*
        fn xor3(a: V, b: V, c: V) -> V {
            xor(xor(a, b), c)
        }
    };
}

pub(super) use {decrypt_rounds, encrypt_rounds, gates_tern, inverse_lt, key, lt, sbox, sbox_bit};
