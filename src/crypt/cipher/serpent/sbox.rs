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
