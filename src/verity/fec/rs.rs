//! Reed-Solomon RS(255, 255 − roots) over GF(2^8), the code dm-verity's FEC uses: field
//! polynomial 0x11d, first consecutive root 0, primitive element 1 (`FEC_PARAMS` in
//! cryptsetup's `lib/verity/verity_fec.c`, Phil Karn's `init_rs_char` in the kernel's
//! `lib/reed_solomon`). [`Rs::encode`] is the reference encoder, byte for byte the shift
//! register of `encode_rs_char`; [`Rs::feed_column`] runs the same register over many
//! codewords at once, one per byte of a block, which is how the FEC area interleaves them.

/// Symbols per codeword (2^8 − 1).
pub const NN: usize = 255;
/// The fewest parity bytes per codeword veritysetup accepts (`FEC_MAX_RSN` = 253).
pub const MIN_ROOTS: u8 = 2;
/// The most parity bytes per codeword veritysetup accepts (`FEC_MIN_RSN` = 231).
pub const MAX_ROOTS: u8 = 24;
/// The field's generator polynomial, x^8 + x^4 + x^3 + x^2 + 1.
const GF_POLY: u16 = 0x11d;
/// The index form of zero (log 0 = −∞), as Karn's code writes it.
const A0: usize = NN;

fn modnn(x: usize) -> usize {
    x % NN
}

/// GF(2^8) log and antilog tables.
struct Field {
    /// α^i for i in 0..255 (index 255 unused).
    exp: [u8; 256],
    /// log_α(x) for x in 1..256 (index 0 unused: log 0 is −∞).
    log: [u8; 256],
}

impl Field {
    fn new() -> Field {
        let mut exp = [0u8; 256];
        let mut log = [0u8; 256];
        // log 0 is −∞, written as 255 (Karn's A0); α^255 stands for 0.
        log[0] = A0 as u8;
        let mut sr: u16 = 1;
        for (i, e) in exp.iter_mut().take(NN).enumerate() {
            *e = sr as u8;
            log[sr as usize] = i as u8;
            sr <<= 1;
            if sr & 0x100 != 0 {
                sr ^= GF_POLY;
            }
        }
        Field { exp, log }
    }

    fn mul(&self, a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            return 0;
        }
        self.exp[(usize::from(self.log[a as usize]) + usize::from(self.log[b as usize])) % NN]
    }
}

/// A Reed-Solomon code with `roots` parity bytes per codeword.
pub struct Rs {
    roots: usize,
    field: Field,
    /// The generator polynomial's coefficients g_0 .. g_roots (g_roots = 1), as values.
    generator: Vec<u8>,
    /// For each coefficient g_k (k < roots), the table x ↦ x·g_k.
    products: Vec<[u8; 256]>,
}

impl Rs {
    /// The code with `roots` parity bytes (2..=24, as veritysetup and the kernel allow).
    pub fn new(roots: u8) -> Option<Rs> {
        if !(MIN_ROOTS..=MAX_ROOTS).contains(&roots) {
            return None;
        }
        let roots = usize::from(roots);
        let f = Field::new();
        // The product of (x + α^i) for i in 0..roots (fcr 0, prim 1), lowest degree first.
        let mut g = vec![0u8; roots + 1];
        g[0] = 1;
        for i in 0..roots {
            let root = f.exp[i];
            g[i + 1] = 1;
            for j in (1..=i).rev() {
                g[j] = g[j - 1] ^ f.mul(g[j], root);
            }
            g[0] = f.mul(g[0], root);
        }
        let products = g[..roots]
            .iter()
            .map(|&c| std::array::from_fn(|x| f.mul(x as u8, c)))
            .collect();
        Some(Rs {
            roots,
            field: f,
            generator: g,
            products,
        })
    }

    /// Parity bytes per codeword.
    pub fn roots(&self) -> usize {
        self.roots
    }

    /// Data bytes per codeword (255 − roots).
    pub fn data_len(&self) -> usize {
        NN - self.roots
    }

    /// The parity of one codeword (`encode_rs_char`): `data` holds 255 − roots bytes,
    /// `parity` receives `roots`.
    pub fn encode(&self, data: &[u8], parity: &mut [u8]) {
        let r = self.roots;
        debug_assert_eq!(data.len(), self.data_len());
        debug_assert_eq!(parity.len(), r);
        parity.fill(0);
        for &d in data {
            let feedback = d ^ parity[0];
            for (j, p) in parity.iter_mut().enumerate().skip(1) {
                *p ^= self.products[r - j][feedback as usize];
            }
            parity.copy_within(1.., 0);
            parity[r - 1] = self.products[0][feedback as usize];
        }
    }

    /// Correct the codeword `word` (255 bytes: 255 − roots of data, then the parity) in
    /// place, as the kernel's `decode_rs8` does: `erasures` are positions known to be bad
    /// (blocks whose hash failed), which lets 2·errors + erasures ≤ roots be corrected.
    /// Returns the number of symbols corrected, or `None` when the word is beyond repair (it
    /// is then left unchanged). A position named twice is one erasure.
    pub fn decode(&self, word: &mut [u8], erasures: &[usize]) -> Option<usize> {
        let (exp, log) = (&self.field.exp, &self.field.log);
        let nroots = self.roots;
        let ex = |i: usize| usize::from(exp[i]);
        let lg = |v: usize| usize::from(log[v]);
        if word.len() != NN || erasures.iter().any(|&p| p >= NN) {
            return None;
        }
        // A repeated position would put a double root in the erasure locator, which the
        // Chien search counts once: the word would be refused although it is correctable.
        let erasures: std::borrow::Cow<'_, [usize]> = if erasures.windows(2).all(|w| w[0] < w[1]) {
            erasures.into()
        } else {
            let mut e = erasures.to_vec();
            e.sort_unstable();
            e.dedup();
            e.into()
        };
        // Syndromes: the word evaluated at the roots α^i of the generator.
        let mut s = vec![0usize; nroots];
        for si in s.iter_mut() {
            *si = usize::from(word[0]);
        }
        for &d in &word[1..] {
            for (i, si) in s.iter_mut().enumerate() {
                *si = if *si == 0 {
                    usize::from(d)
                } else {
                    usize::from(d) ^ ex(modnn(lg(*si) + i))
                };
            }
        }
        // A codeword is left alone whatever the erasures say, as the kernel returns before
        // it looks at them: a round with more bad blocks than roots still decodes the
        // codewords their damage missed.
        if s.iter().all(|&x| x == 0) {
            return Some(0);
        }
        // The kernel's dm-verity marks at most roots + 1 erasures, and `decode_rs` then writes
        // past its locator (undefined); no codeword can be rebuilt from more unknowns than
        // syndromes, so more erasures than roots fail here.
        if erasures.len() > nroots {
            return None;
        }
        for si in s.iter_mut() {
            *si = lg(*si);
        }
        // The erasure locator starts lambda; Berlekamp-Massey extends it with the errors.
        let mut lambda = vec![0usize; nroots + 1];
        lambda[0] = 1;
        if let Some(&first) = erasures.first() {
            lambda[1] = ex(modnn(NN - 1 - first));
            for (i, &pos) in erasures.iter().enumerate().skip(1) {
                let u = modnn(NN - 1 - pos);
                for j in (1..=i + 1).rev() {
                    let tmp = lg(lambda[j - 1]);
                    if tmp != A0 {
                        lambda[j] ^= ex(modnn(u + tmp));
                    }
                }
            }
        }
        let no_eras = erasures.len();
        let mut b: Vec<usize> = lambda.iter().map(|&l| lg(l)).collect();
        let mut t = vec![0usize; nroots + 1];
        let mut el = no_eras;
        for r in no_eras + 1..=nroots {
            let mut discr = 0usize;
            for i in 0..r {
                if lambda[i] != 0 && s[r - i - 1] != A0 {
                    discr ^= ex(modnn(lg(lambda[i]) + s[r - i - 1]));
                }
            }
            let discr = lg(discr);
            if discr == A0 {
                b.copy_within(0..nroots, 1);
                b[0] = A0;
                continue;
            }
            t[0] = lambda[0];
            for i in 0..nroots {
                t[i + 1] = if b[i] != A0 {
                    lambda[i + 1] ^ ex(modnn(discr + b[i]))
                } else {
                    lambda[i + 1]
                };
            }
            if 2 * el < r + no_eras {
                el = r + no_eras - el;
                for (bi, &li) in b.iter_mut().zip(&lambda) {
                    *bi = if li == 0 {
                        A0
                    } else {
                        modnn(lg(li) + NN - discr)
                    };
                }
            } else {
                b.copy_within(0..nroots, 1);
                b[0] = A0;
            }
            lambda.copy_from_slice(&t);
        }
        // lambda in index form, and its degree.
        let mut deg_lambda = 0;
        for (i, l) in lambda.iter_mut().enumerate() {
            *l = lg(*l);
            if *l != A0 {
                deg_lambda = i;
            }
        }
        // Chien search: the roots of lambda are the inverses of the error locations.
        let mut reg = lambda.clone();
        let (mut roots, mut locs) = (Vec::new(), Vec::new());
        // The location of root α^i: k = i − 1 (iprim = 1 with prim = 1).
        let mut k = 0;
        for i in 1..=NN {
            let mut q = 1usize;
            for j in (1..=deg_lambda).rev() {
                if reg[j] != A0 {
                    reg[j] = modnn(reg[j] + j);
                    q ^= ex(reg[j]);
                }
            }
            if q == 0 {
                roots.push(i);
                locs.push(k);
                if roots.len() == deg_lambda {
                    break;
                }
            }
            k = modnn(k + 1);
        }
        // deg(lambda) 0 with a non-zero syndrome, or fewer roots than its degree: beyond
        // repair (decode_rs's -EBADMSG).
        if deg_lambda == 0 || deg_lambda != roots.len() {
            return None;
        }
        // The evaluator omega = s·lambda mod x^roots, index form.
        let deg_omega = deg_lambda - 1;
        let mut omega = vec![A0; deg_omega + 1];
        for (i, o) in omega.iter_mut().enumerate() {
            let mut tmp = 0usize;
            for j in 0..=i {
                if s[i - j] != A0 && lambda[j] != A0 {
                    tmp ^= ex(modnn(s[i - j] + lambda[j]));
                }
            }
            *o = lg(tmp);
        }
        // Forney: the error values (fcr = 0), as decode_rs computes them (a zero denominator
        // is not special-cased there: log 0 is A0 = NN, so the value comes out as
        // num1·num2 and the syndrome check below refuses it).
        let mut values = vec![0u8; roots.len()];
        let mut corrected = 0;
        for (&root, v) in roots.iter().zip(values.iter_mut()) {
            let mut num1 = 0usize;
            for (i, &o) in omega.iter().enumerate().rev() {
                if o != A0 {
                    num1 ^= ex(modnn(o + i * root));
                }
            }
            let num2 = ex(modnn(root * (NN - 1) + NN));
            let mut den = 0usize;
            let top = deg_lambda.min(nroots - 1) & !1;
            for i in (0..=top).rev().step_by(2) {
                if lambda[i + 1] != A0 {
                    den ^= ex(modnn(lambda[i + 1] + i * root));
                }
            }
            if num1 != 0 {
                *v = exp[modnn(lg(num1) + lg(num2) + NN - lg(den))];
                corrected += 1;
            }
        }
        // The kernel's last check (rslib since 5.3): the syndrome of the error pattern must be
        // the received word's, or the pattern is a miscorrection of too many errors.
        for (i, &si) in s.iter().enumerate() {
            let mut tmp = 0u8;
            for (&v, &loc) in values.iter().zip(&locs) {
                if v != 0 {
                    tmp ^= exp[modnn(lg(usize::from(v)) + i * (NN - loc - 1))];
                }
            }
            if tmp != exp[si] {
                return None;
            }
        }
        for (&v, &loc) in values.iter().zip(&locs) {
            word[loc] ^= v;
        }
        Some(corrected)
    }

    /// The generator polynomial's coefficients, lowest degree first (for tests).
    pub fn generator(&self) -> &[u8] {
        &self.generator
    }

    /// Feed one data symbol to `width` codewords at once: `column[b]` is symbol of codeword
    /// `b`. `registers` holds `roots` rows of `width` bytes, rotated: row `(head + j) % roots`
    /// is parity byte `j` of every codeword. Returns the new head.
    pub fn feed_column(
        &self,
        registers: &mut [u8],
        width: usize,
        head: usize,
        column: &[u8],
    ) -> usize {
        let r = self.roots;
        debug_assert_eq!(registers.len(), r * width);
        debug_assert_eq!(column.len(), width);
        // The feedback replaces row 0 (its old value is consumed), the other rows take its
        // products, and row 0's storage becomes the new last row: a shift without copies.
        let (before, rest) = registers.split_at_mut(head * width);
        let (first, after) = rest.split_at_mut(width);
        for (f, &d) in first.iter_mut().zip(column) {
            *f ^= d;
        }
        for j in 1..r {
            let at = (head + j) % r;
            let row = if at > head {
                &mut after[(at - head - 1) * width..(at - head) * width]
            } else {
                &mut before[at * width..(at + 1) * width]
            };
            let table = &self.products[r - j];
            for (p, &fb) in row.iter_mut().zip(first.iter()) {
                *p ^= table[fb as usize];
            }
        }
        let last = &self.products[0];
        for f in first.iter_mut() {
            *f = last[*f as usize];
        }
        (head + 1) % r
    }

    /// Write the parity of `width` codewords held in `registers` (rotated by `head`) as
    /// veritysetup stores it: codeword by codeword, `roots` bytes each.
    pub fn parity_out(&self, registers: &[u8], width: usize, head: usize, out: &mut [u8]) {
        let r = self.roots;
        debug_assert_eq!(out.len(), r * width);
        for j in 0..r {
            let row = &registers[((head + j) % r) * width..][..width];
            for (b, &p) in row.iter().enumerate() {
                out[b * r + j] = p;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `encode_rs_char` as cryptsetup writes it, on index-form tables, to check ours against
    /// (kept line for line with the C, indexes included).
    #[allow(clippy::needless_range_loop, clippy::explicit_counter_loop)]
    fn karn_encode(roots: usize, data: &[u8]) -> Vec<u8> {
        let nn = 255usize;
        let mut alpha_to = [0u8; 256];
        let mut index_of = [0u8; 256];
        index_of[0] = nn as u8;
        let mut sr = 1usize;
        for i in 0..nn {
            index_of[sr] = i as u8;
            alpha_to[i] = sr as u8;
            sr <<= 1;
            if sr & 0x100 != 0 {
                sr ^= 0x11d;
            }
            sr &= nn;
        }
        let modnn = |x: usize| x % nn;
        let mut genpoly = vec![0u8; roots + 1];
        genpoly[0] = 1;
        let mut root = 0usize;
        for i in 0..roots {
            genpoly[i + 1] = 1;
            for j in (1..=i).rev() {
                genpoly[j] = if genpoly[j] != 0 {
                    genpoly[j - 1] ^ alpha_to[modnn(index_of[genpoly[j] as usize] as usize + root)]
                } else {
                    genpoly[j - 1]
                };
            }
            genpoly[0] = alpha_to[modnn(index_of[genpoly[0] as usize] as usize + root)];
            root += 1;
        }
        let gidx: Vec<usize> = genpoly
            .iter()
            .map(|&g| index_of[g as usize] as usize)
            .collect();
        let mut parity = vec![0u8; roots];
        for &d in &data[..nn - roots] {
            let feedback = index_of[(d ^ parity[0]) as usize] as usize;
            if feedback != nn {
                for j in 1..roots {
                    parity[j] ^= alpha_to[modnn(feedback + gidx[roots - j])];
                }
            }
            parity.copy_within(1.., 0);
            parity[roots - 1] = if feedback != nn {
                alpha_to[modnn(feedback + gidx[0])]
            } else {
                0
            };
        }
        parity
    }

    use crate::verity::tests::random_bytes as noise;

    #[test]
    fn the_encoder_is_karns_for_every_roots_count() {
        for roots in MIN_ROOTS..=MAX_ROOTS {
            let rs = Rs::new(roots).unwrap();
            assert_eq!(rs.generator()[usize::from(roots)], 1, "monic");
            for seed in 0..8 {
                let data = noise(rs.data_len(), seed + u64::from(roots) * 100);
                let mut p = vec![0u8; rs.roots()];
                rs.encode(&data, &mut p);
                assert_eq!(
                    p,
                    karn_encode(rs.roots(), &data),
                    "roots {roots} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn a_codeword_is_a_multiple_of_the_generator() {
        // Evaluated at every root α^i (i < roots), data followed by parity gives zero.
        let f = Field::new();
        for roots in [2u8, 3, 16, 24] {
            let rs = Rs::new(roots).unwrap();
            let data = noise(rs.data_len(), u64::from(roots));
            let mut p = vec![0u8; rs.roots()];
            rs.encode(&data, &mut p);
            let word: Vec<u8> = data.iter().chain(&p).copied().collect();
            for i in 0..rs.roots() {
                let x = f.exp[i];
                let v = word.iter().fold(0u8, |acc, &c| f.mul(acc, x) ^ c);
                assert_eq!(v, 0, "roots {roots}, root α^{i}");
            }
        }
    }

    #[test]
    fn columns_give_the_same_parity_as_one_codeword_at_a_time() {
        for roots in [2u8, 5, 24] {
            let rs = Rs::new(roots).unwrap();
            let width = 37;
            let words: Vec<Vec<u8>> = (0..width)
                .map(|b| noise(rs.data_len(), b as u64 * 7 + u64::from(roots)))
                .collect();
            let mut regs = vec![0u8; rs.roots() * width];
            let mut head = 0;
            for i in 0..rs.data_len() {
                let column: Vec<u8> = words.iter().map(|w| w[i]).collect();
                head = rs.feed_column(&mut regs, width, head, &column);
            }
            let mut out = vec![0u8; rs.roots() * width];
            rs.parity_out(&regs, width, head, &mut out);
            for (b, w) in words.iter().enumerate() {
                let mut p = vec![0u8; rs.roots()];
                rs.encode(w, &mut p);
                assert_eq!(&out[b * rs.roots()..][..rs.roots()], &p[..], "codeword {b}");
            }
        }
    }

    /// A codeword of random data and its parity.
    fn codeword(rs: &Rs, seed: u64) -> Vec<u8> {
        let mut w = noise(rs.data_len(), seed);
        let mut p = vec![0u8; rs.roots()];
        rs.encode(&w, &mut p);
        w.extend_from_slice(&p);
        w
    }

    /// `n` distinct positions of a codeword, from `seed`.
    fn positions(n: usize, seed: u64) -> Vec<usize> {
        let mut out = Vec::new();
        for b in noise(4 * NN, seed) {
            let p = b as usize % NN;
            if out.len() < n && !out.contains(&p) {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn up_to_half_the_roots_in_errors_are_corrected() {
        for roots in [2u8, 3, 4, 7, 16, 24] {
            let rs = Rs::new(roots).unwrap();
            for t in 0..=rs.roots() / 2 {
                for seed in 0..6u64 {
                    let good = codeword(&rs, seed * 31 + t as u64);
                    let mut w = good.clone();
                    let at = positions(t, seed + 1000 * t as u64);
                    for (k, &p) in at.iter().enumerate() {
                        w[p] ^= 1 + (k as u8 % 255);
                    }
                    assert_eq!(rs.decode(&mut w, &[]), Some(t), "roots {roots}, {t} errors");
                    assert!(w == good, "roots {roots}, {t} errors: restored");
                }
            }
        }
    }

    #[test]
    fn erasures_count_half_as_much_as_errors() {
        for roots in [2u8, 5, 8, 24] {
            let rs = Rs::new(roots).unwrap();
            let r = rs.roots();
            for e in 1..=r {
                let t = (r - e) / 2;
                let good = codeword(&rs, e as u64 * 7 + u64::from(roots));
                let mut w = good.clone();
                let at = positions(e + t, e as u64 * 13 + u64::from(roots));
                for &p in &at {
                    w[p] ^= 0x5a;
                }
                // Erasures are the first e positions, the rest are errors nobody marked.
                let got = rs.decode(&mut w, &at[..e]);
                assert_eq!(got, Some(e + t), "roots {roots}: {e} erasures + {t} errors");
                assert!(
                    w == good,
                    "roots {roots}: {e} erasures + {t} errors restored"
                );
            }
        }
    }

    #[test]
    fn a_word_beyond_repair_is_left_as_it_was() {
        // Five errors with eight roots: mostly detected (with two roots every word decodes to
        // some codeword: only the hash tree can tell a miscorrection).
        let rs = Rs::new(8).unwrap();
        let mut found = 0;
        for seed in 0..200u64 {
            let mut w = codeword(&rs, seed);
            for &p in &positions(5, seed + 7) {
                w[p] ^= 0x33;
            }
            let before = w.clone();
            if rs.decode(&mut w, &[]).is_none() {
                assert_eq!(w, before);
                found += 1;
            }
        }
        assert!(
            found > 100,
            "five errors with eight roots are mostly detected: {found}/200"
        );
        let mut w = vec![0u8; 10];
        assert_eq!(rs.decode(&mut w, &[]), None, "a short word is refused");
        let mut w = codeword(&rs, 5);
        w[3] ^= 1;
        assert_eq!(
            rs.decode(&mut w, &[0, 1, 2, 3, 4, 5, 6, 7, 8]),
            None,
            "more erasures than roots"
        );
        let mut w = codeword(&rs, 6);
        assert_eq!(
            rs.decode(&mut w, &[0, 1, 2, 3, 4, 5, 6, 7, 8]),
            Some(0),
            "a clean codeword passes whatever the erasures (as decode_rs returns first)"
        );
    }

    #[test]
    fn any_bytes_and_erasures_decode_without_panic() {
        // Parity comes from disk: the decoder must take anything.
        for roots in [2u8, 3, 13, 24] {
            let rs = Rs::new(roots).unwrap();
            for seed in 0..300u64 {
                let mut w = noise(NN, seed * 97 + u64::from(roots));
                let n = (seed as usize) % (rs.roots() + 1);
                let mut eras: Vec<usize> =
                    noise(n, seed).iter().map(|&b| b as usize % NN).collect();
                eras.sort_unstable();
                eras.dedup();
                if let Some(k) = rs.decode(&mut w, &eras) {
                    assert!(k <= NN);
                }
            }
        }
    }

    #[test]
    fn roots_outside_2_to_24_are_refused() {
        assert!(Rs::new(1).is_none());
        assert!(Rs::new(25).is_none());
        assert!(Rs::new(0).is_none());
    }
}
