//! Serpent's eight S-boxes and their inverses (Anderson, Biham, Knudsen, 1998), and each
//! S-box output bit as two 3-input boolean functions, selected by the fourth input: the form
//! AVX-512's `vpternlogd` evaluates in one instruction, and the other backends in a few gates.

/// S0..S7: the nibble `x0 | x1 << 1 | x2 << 2 | x3 << 3` goes to `SBOX[i][nibble]`.
pub(super) const SBOX: [[u8; 16]; 8] = [
    [3, 8, 15, 1, 10, 6, 5, 11, 14, 13, 4, 2, 7, 0, 9, 12],
    [15, 12, 2, 7, 9, 0, 5, 10, 1, 11, 14, 8, 6, 13, 3, 4],
    [8, 6, 7, 9, 3, 12, 10, 15, 13, 1, 14, 4, 0, 11, 5, 2],
    [0, 15, 11, 8, 12, 9, 6, 3, 13, 1, 2, 4, 10, 7, 5, 14],
    [1, 15, 8, 3, 12, 0, 11, 6, 2, 5, 4, 10, 9, 14, 7, 13],
    [15, 5, 2, 11, 4, 10, 9, 12, 0, 3, 14, 8, 13, 6, 7, 1],
    [7, 2, 12, 5, 8, 4, 6, 11, 14, 9, 1, 15, 13, 3, 10, 0],
    [1, 13, 15, 0, 14, 8, 2, 11, 7, 4, 12, 10, 9, 3, 5, 6],
];

const fn invert(s: &[u8; 16]) -> [u8; 16] {
    let mut inv = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        inv[s[i] as usize] = i as u8;
        i += 1;
    }
    inv
}

const fn invert_all() -> [[u8; 16]; 8] {
    let mut out = [[0u8; 16]; 8];
    let mut i = 0;
    while i < 8 {
        out[i] = invert(&SBOX[i]);
        i += 1;
    }
    out
}

/// The inverse S-boxes, for decryption.
pub(super) const INVERSE: [[u8; 16]; 8] = invert_all();

/// The truth table of output bit `k` of `s` with x3 fixed to `d`, as a `vpternlogd`
/// immediate over (x0, x1, x2): bit `x0 << 2 | x1 << 1 | x2` of the result.
const fn imm(s: &[u8; 16], k: usize, d: usize) -> i32 {
    let mut imm = 0;
    let mut idx = 0;
    while idx < 8 {
        let (a, b, c) = ((idx >> 2) & 1, (idx >> 1) & 1, idx & 1);
        let nibble = a | b << 1 | c << 2 | d << 3;
        if (s[nibble] >> k) & 1 == 1 {
            imm |= 1 << idx;
        }
        idx += 1;
    }
    imm
}

const fn imms(boxes: &[[u8; 16]; 8]) -> [[[i32; 2]; 4]; 8] {
    let mut out = [[[0; 2]; 4]; 8];
    let mut i = 0;
    while i < 8 {
        let mut k = 0;
        while k < 4 {
            out[i][k] = [imm(&boxes[i], k, 0), imm(&boxes[i], k, 1)];
            k += 1;
        }
        i += 1;
    }
    out
}

/// `ENC[i][k][d]`: output bit `k` of S-box `i` with x3 = `d`, as a function of (x0, x1, x2).
pub(super) const ENC: [[[i32; 2]; 4]; 8] = imms(&SBOX);
/// The same for the inverse S-boxes.
pub(super) const DEC: [[[i32; 2]; 4]; 8] = imms(&INVERSE);

/// An S-box output bit as two dependent 3-input functions of the four input bits, where one
/// exists: `outer(inner(x[i0], x[i1], x[i2]), x[o0], x[o1])` (`vpternlogd` immediates).
/// Cheaper than the generic form (two 3-input halves and a select: three operations).
pub(super) struct Two {
    /// The inputs of the first function.
    pub(super) inner: [usize; 3],
    /// The first function's immediate.
    pub(super) imm1: i32,
    /// The other two inputs of the second function (its first is the first's output).
    pub(super) outer: [usize; 2],
    /// The second function's immediate.
    pub(super) imm2: i32,
}

// The tables below are the output of an exhaustive search (every choice of inputs and
// immediates, first match kept), not derived here; the test `two_step_forms_match_the_boxes`
// checks every entry against the S-boxes.

/// `ENC_TWO[i][k]`: output bit `k` of S-box `i` in two steps, where it has such a form.
pub(super) const ENC_TWO: [[Option<Two>; 4]; 8] = [
    [
        None,
        None,
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x66,
            outer: [0, 3],
            imm2: 0x1e,
        }),
    ],
    [
        None,
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x0c,
            outer: [2, 3],
            imm2: 0x69,
        }),
        None,
    ],
    [
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x0a,
            outer: [1, 3],
            imm2: 0x96,
        }),
        None,
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x16,
            outer: [1, 3],
            imm2: 0x87,
        }),
    ],
    [None, None, None, None],
    [
        Some(Two {
            inner: [0, 1, 3],
            imm1: 0x24,
            outer: [2, 3],
            imm2: 0x69,
        }),
        None,
        None,
        Some(Two {
            inner: [0, 1, 3],
            imm1: 0x58,
            outer: [1, 2],
            imm2: 0x1e,
        }),
    ],
    [
        Some(Two {
            inner: [0, 1, 3],
            imm1: 0x24,
            outer: [2, 3],
            imm2: 0x69,
        }),
        Some(Two {
            inner: [0, 1, 3],
            imm1: 0x38,
            outer: [2, 3],
            imm2: 0xe1,
        }),
        None,
        None,
    ],
    [
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x66,
            outer: [0, 3],
            imm2: 0x87,
        }),
        None,
        None,
    ],
    [
        None,
        None,
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x46,
            outer: [0, 3],
            imm2: 0xb4,
        }),
    ],
];
/// The same for the inverse S-boxes.
pub(super) const DEC_TWO: [[Option<Two>; 4]; 8] = [
    [
        None,
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x03,
            outer: [2, 3],
            imm2: 0x96,
        }),
        None,
    ],
    [
        None,
        None,
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x5a,
            outer: [1, 3],
            imm2: 0xd2,
        }),
    ],
    [
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x1e,
            outer: [1, 3],
            imm2: 0x78,
        }),
        None,
        None,
        None,
    ],
    [
        Some(Two {
            inner: [1, 2, 3],
            imm1: 0x2c,
            outer: [0, 3],
            imm2: 0x1e,
        }),
        None,
        None,
        None,
    ],
    [
        None,
        Some(Two {
            inner: [0, 2, 3],
            imm1: 0x76,
            outer: [0, 1],
            imm2: 0xb4,
        }),
        None,
        Some(Two {
            inner: [0, 1, 3],
            imm1: 0x2c,
            outer: [2, 3],
            imm2: 0xb4,
        }),
    ],
    [
        Some(Two {
            inner: [0, 1, 3],
            imm1: 0x16,
            outer: [1, 2],
            imm2: 0xb4,
        }),
        None,
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x26,
            outer: [0, 3],
            imm2: 0x87,
        }),
    ],
    [
        None,
        Some(Two {
            inner: [0, 1, 2],
            imm1: 0x0a,
            outer: [1, 3],
            imm2: 0x69,
        }),
        None,
        None,
    ],
    [None, None, None, None],
];

/// Apply S-box `s` to four words bit by bit (the key schedule's S-boxes).
pub(super) fn apply_scalar(s: &[u8; 16], x: [u32; 4]) -> [u32; 4] {
    let mut out = [0u32; 4];
    for j in 0..32 {
        let nibble = (0..4).fold(0usize, |n, w| n | (((x[w] >> j) & 1) as usize) << w);
        let o = s[nibble];
        for (w, word) in out.iter_mut().enumerate() {
            *word |= u32::from((o >> w) & 1) << j;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_step_forms_match_the_boxes() {
        let tern = |imm: i32, a: usize, b: usize, c: usize| (imm >> (a << 2 | b << 1 | c)) & 1;
        let mut found = 0;
        for (boxes, forms) in [(&SBOX, &ENC_TWO), (&INVERSE, &DEC_TWO)] {
            for (sbox, bits) in boxes.iter().zip(forms.iter()) {
                for (k, form) in bits.iter().enumerate() {
                    let Some(t) = form else { continue };
                    found += 1;
                    for (nibble, &out) in sbox.iter().enumerate() {
                        let x = |i: usize| nibble >> i & 1;
                        let u = tern(t.imm1, x(t.inner[0]), x(t.inner[1]), x(t.inner[2]));
                        let bit = tern(t.imm2, u as usize, x(t.outer[0]), x(t.outer[1]));
                        assert_eq!(bit as u8, out >> k & 1, "{nibble} bit {k}");
                    }
                }
            }
        }
        assert_eq!(found, 19);
    }

    #[test]
    fn boxes_are_permutations_and_tables_match_them() {
        for (i, sbox) in SBOX.iter().enumerate() {
            assert_eq!(invert(&INVERSE[i]), *sbox);
            for (nibble, &out) in sbox.iter().enumerate() {
                let (a, b, c, d) = (nibble & 1, nibble >> 1 & 1, nibble >> 2 & 1, nibble >> 3);
                for (k, halves) in ENC[i].iter().enumerate() {
                    let bit = halves[d] >> (a << 2 | b << 1 | c) & 1;
                    assert_eq!(bit as u8, out >> k & 1);
                }
            }
        }
    }
}
