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

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

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

    #[test]
    fn roots_outside_2_to_24_are_refused() {
        assert!(Rs::new(1).is_none());
        assert!(Rs::new(25).is_none());
        assert!(Rs::new(0).is_none());
    }
}
