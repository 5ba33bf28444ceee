//! Multi-lane SHA-256 from a given state: many equal-length messages, each
//! `prefix || body`, hashed side by side in SIMD lanes (16 on AVX-512, 8 on AVX2), every one
//! starting from the same chaining value after `absorbed` bytes, optionally finished by one
//! more compression from a second state (HMAC's outer hash).
//!
//! Why not `tape-sha256`: it starts every message from the standard IV, so an HMAC tag pays
//! the inner and outer pad blocks again for every sector (two compressions of eleven for a
//! 512-byte sector), and the outer hash is a separate batch with its own transposes. Here the
//! pad blocks are compressed once per key ([`HmacState`]), and the outer block is built in the
//! registers from the inner digest.
//!
//! The message words of the lanes are loaded straight from the caller's buffers (each lane's
//! 64-byte block, then a 16x16 or 8x8 transpose); only the block holding the prefix and the
//! blocks holding the end of the message and its padding are staged. Where neither SIMD
//! kernel applies (no AVX2, or a lone message), the `sha2` crate's block function runs one
//! message at a time from the same state (SHA-NI where the CPU has it). Where the CPU has the
//! SHA extensions, groups of eight or fewer messages (a 4 KiB request of 512-byte sectors)
//! go to [`super::sha256_shani`] instead, four messages interleaved: faster than half-empty
//! AVX-512 lanes and than AVX2's eight.

use sha2::digest::generic_array::GenericArray;

/// SHA-256's initial chaining value.
pub(crate) const IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// The round constants.
pub(crate) const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// One compression of `block` into `state` (the `sha2` crate's block function).
pub(crate) fn compress(state: &mut [u32; 8], block: &[u8]) {
    sha2::compress256(state, &[*GenericArray::from_slice(block)]);
}

/// The chaining values of an HMAC-SHA-256 key after its inner and outer pad blocks: every tag
/// starts from these instead of compressing `key ^ 0x36` and `key ^ 0x5c` again.
#[derive(Clone)]
pub struct HmacState {
    pub(crate) inner: [u32; 8],
    pub(crate) outer: [u32; 8],
}

impl HmacState {
    /// The states of `key` (a key longer than 64 bytes is hashed first, as RFC 2104 and the
    /// kernel's `hmac()` do).
    pub fn new(key: &[u8]) -> HmacState {
        use sha2::Digest;
        let digest = |k: &[u8]| zeroize::Zeroizing::new(sha2::Sha256::digest(k).to_vec());
        let (mut inner, mut outer) = (IV, IV);
        compress(&mut inner, &super::md::key_pad::<64>(key, digest, 0x36)[..]);
        compress(&mut outer, &super::md::key_pad::<64>(key, digest, 0x5c)[..]);
        HmacState { inner, outer }
    }

    /// The HMAC of the concatenation of `parts`, one message (the `sha2` crate from the
    /// states).
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut st = self.inner;
        super::md::feed::<64>(parts, 64, 8, |b| compress(&mut st, b));
        let mut o = self.outer;
        compress(&mut o, &outer_block(&st));
        let mut out = [0u8; 32];
        put(&o, &mut out);
        out
    }
}

impl Drop for HmacState {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.inner.zeroize();
        self.outer.zeroize();
    }
}

impl std::fmt::Debug for HmacState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacState(<secret>)")
    }
}

/// A batch: message `i` is `prefixes[i*prefix_len..][..prefix_len] || bodies[i*body_len..]
/// [..body_len]`, hashed from `start` as if `absorbed` bytes (a multiple of 64) came before
/// it; with `outer`, the digest is then hashed once more from that state after 64 bytes
/// (HMAC's outer hash).
#[derive(Clone, Copy)]
pub(crate) struct Batch<'a> {
    pub start: &'a [u32; 8],
    pub absorbed: u64,
    pub prefixes: &'a [u8],
    pub prefix_len: usize,
    pub bodies: &'a [u8],
    pub body_len: usize,
    pub outer: Option<&'a [u32; 8]>,
}

impl Batch<'_> {
    /// The number of messages.
    fn count(&self) -> usize {
        match self.bodies.len().checked_div(self.body_len) {
            Some(n) => n,
            None => self
                .prefixes
                .len()
                .checked_div(self.prefix_len)
                .unwrap_or(0),
        }
    }
}

/// The lane engine chosen for this CPU: "avx512-16", "avx2-8" or "sha2" (one message at a
/// time through the `sha2` crate's block function), with "+shani" where groups of up to
/// eight messages go to the SHA extensions instead.
pub(crate) fn backend() -> &'static str {
    let shani = super::sha256_shani::available();
    match Kernel::get() {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if shani => "avx512-16+shani",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => "avx512-16",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 | Kernel::ShaNi if shani => "shani",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 | Kernel::ShaNi => "avx2-8",
        Kernel::Serial => "sha2",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Only ever chosen by the tests: every group through the SHA extensions.
    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(not(test), allow(dead_code))]
    ShaNi,
    Serial,
}

/// How one group of a batch is hashed.
#[derive(Clone, Copy)]
enum Path {
    #[cfg(target_arch = "x86_64")]
    Lanes16,
    #[cfg(target_arch = "x86_64")]
    Lanes8,
    /// Up to four messages interleaved through the SHA extensions.
    #[cfg(target_arch = "x86_64")]
    ShaNi,
    Serial,
}

impl Kernel {
    fn get() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            static K: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
            *K.get_or_init(|| {
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                {
                    Kernel::Avx512
                } else if std::arch::is_x86_feature_detected!("avx2") {
                    Kernel::Avx2
                } else {
                    Kernel::Serial
                }
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Kernel::Serial
    }
}

/// Hash every message of `b` into `out` (32 bytes each), on the lanes of this CPU.
pub(crate) fn hash(b: &Batch<'_>, out: &mut [u8]) {
    hash_with(Kernel::get(), b, out)
}

/// [`hash`] with every kernel this CPU runs, for the tests: (name, digests).
#[cfg(test)]
pub(crate) fn hash_all_kernels(b: &Batch<'_>) -> Vec<(&'static str, Vec<u8>)> {
    let n = b.count();
    let mut v = Vec::new();
    let mut ks = vec![("sha2", Kernel::Serial)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            ks.push(("avx2-8", Kernel::Avx2));
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            ks.push(("avx512-16", Kernel::Avx512));
        }
        if super::sha256_shani::available() {
            ks.push(("shani", Kernel::ShaNi));
        }
    }
    for (name, k) in ks {
        let mut out = vec![0u8; n * 32];
        hash_with(k, b, &mut out);
        v.push((name, out));
    }
    v
}

fn hash_with(kernel: Kernel, b: &Batch<'_>, out: &mut [u8]) {
    let (plen, blen) = (b.prefix_len, b.body_len);
    assert!(plen < 64 && b.absorbed.is_multiple_of(64));
    let n = b.count();
    assert!(b.bodies.len() == n * blen && b.prefixes.len() == n * plen);
    assert_eq!(out.len(), n * 32);
    let shape = Shape::new(b);
    let mut i = 0;
    while i < n {
        let left = n - i;
        #[cfg(target_arch = "x86_64")]
        let shani = super::sha256_shani::available();
        let path = match kernel {
            #[cfg(target_arch = "x86_64")]
            // A group of eight or fewer fills AVX2's lanes as well as half of AVX-512's; the
            // SHA extensions hash such a group faster than either (and a lone message as
            // fast as the `sha2` block function, which uses them too).
            Kernel::Avx512 if left > 8 => Path::Lanes16,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 | Kernel::Avx2 | Kernel::ShaNi if shani => Path::ShaNi,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 | Kernel::Avx2 | Kernel::ShaNi if left > 1 => Path::Lanes8,
            _ => Path::Serial,
        };
        let width = match path {
            #[cfg(target_arch = "x86_64")]
            Path::Lanes16 => 16,
            #[cfg(target_arch = "x86_64")]
            Path::Lanes8 => 8,
            #[cfg(target_arch = "x86_64")]
            Path::ShaNi => 4,
            Path::Serial => 1,
        };
        let k = left.min(width);
        let group = Group::stage(b, &shape, i, k);
        let out = &mut out[i * 32..(i + k) * 32];
        match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Lanes16 is chosen only where Kernel::get() found AVX-512F and BW.
            Path::Lanes16 => unsafe { x86::run16(&group, &shape, b, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Lanes8 is chosen only where AVX2 (or AVX-512, a superset) was found.
            Path::Lanes8 => unsafe { x86::run8(&group, &shape, b, out) },
            #[cfg(target_arch = "x86_64")]
            Path::ShaNi => shani_group(&group, &shape, b, out),
            Path::Serial => serial(&group, &shape, b, out),
        }
        i += k;
    }
}

/// Where the blocks of every message of a batch come from (the same for all: equal lengths).
struct Shape {
    /// Whole 64-byte blocks of message (prefix || body), before the end and its padding.
    full: usize,
    /// Blocks holding the end of the message and the padding (1 or 2).
    tail: usize,
    /// Message bytes in the tail blocks.
    rest: usize,
}

impl Shape {
    fn new(b: &Batch<'_>) -> Shape {
        let len = b.prefix_len + b.body_len;
        let full = len / 64;
        let rest = len % 64;
        Shape {
            full,
            tail: if rest + 9 <= 64 { 1 } else { 2 },
            rest,
        }
    }

    fn blocks(&self) -> usize {
        self.full + self.tail
    }
}

/// The staged blocks of up to 16 messages and where the others are.
struct Group {
    /// Active messages.
    lanes: usize,
    /// Block 0 when it holds the prefix (and the first body bytes).
    head: [[u8; 64]; 16],
    /// The end of the message, 0x80, zeros, and the bit length.
    tail: [[u8; 128]; 16],
    /// Each message's body.
    bodies: [*const u8; 16],
}

impl Group {
    /// Stage messages `first..first + k` of `b`.
    fn stage(b: &Batch<'_>, s: &Shape, first: usize, k: usize) -> Group {
        let (plen, blen) = (b.prefix_len, b.body_len);
        let mut g = Group {
            lanes: k,
            head: [[0u8; 64]; 16],
            tail: [[0u8; 128]; 16],
            bodies: [b.bodies.as_ptr(); 16],
        };
        let bits = (b.absorbed + (plen + blen) as u64) * 8;
        for l in 0..k {
            let m = first + l;
            let prefix = &b.prefixes[m * plen..(m + 1) * plen];
            let body = &b.bodies[m * blen..(m + 1) * blen];
            g.bodies[l] = body.as_ptr();
            if s.full > 0 && plen > 0 {
                copy_small(&mut g.head[l][..plen], prefix);
                copy_small(&mut g.head[l][plen..], &body[..64 - plen]);
            }
            let t = &mut g.tail[l];
            let from = s.full * 64;
            if from >= plen {
                copy_small(&mut t[..s.rest], &body[from - plen..]);
            } else {
                // The whole message is shorter than a block.
                copy_small(&mut t[..plen], prefix);
                copy_small(&mut t[plen..s.rest], body);
            }
            t[s.rest] = 0x80;
            let end = s.tail * 64;
            t[end - 8..end].copy_from_slice(&bits.to_be_bytes());
        }
        g
    }

    /// Block `j` of lane `l`.
    fn block(&self, s: &Shape, plen: usize, l: usize, j: usize) -> *const u8 {
        if j >= s.full {
            self.tail[l][(j - s.full) * 64..].as_ptr()
        } else if j == 0 && plen > 0 {
            self.head[l].as_ptr()
        } else {
            // SAFETY (for the readers): 64 j - plen + 64 <= body_len for j < full.
            self.bodies[l].wrapping_add(64 * j - plen)
        }
    }
}

/// `dst.copy_from_slice(src)` for the at most 64 bytes a staged block takes: two overlapping
/// copies of a fixed size, not a call to `memcpy` with a run-time length (three of those per
/// message cost about 8% of the lanes' time on 512-byte sectors).
#[inline(always)]
fn copy_small(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    assert!(dst.len() == n && n <= 64);
    macro_rules! two {
        ($w:literal) => {{
            dst[..$w].copy_from_slice(&src[..$w]);
            dst[n - $w..].copy_from_slice(&src[n - $w..]);
        }};
    }
    match n {
        32.. => two!(32),
        16.. => two!(16),
        8.. => two!(8),
        4.. => two!(4),
        _ => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
    }
}

/// The outer block of HMAC-SHA-256 over a 32-byte inner digest, after the 64-byte pad.
fn outer_block(digest: &[u32; 8]) -> [u8; 64] {
    let mut blk = [0u8; 64];
    for (c, w) in blk.chunks_exact_mut(4).zip(digest) {
        c.copy_from_slice(&w.to_be_bytes());
    }
    blk[32] = 0x80;
    blk[56..].copy_from_slice(&((64u64 + 32) * 8).to_be_bytes());
    blk
}

fn put(state: &[u32; 8], out: &mut [u8]) {
    for (c, w) in out.chunks_exact_mut(4).zip(state) {
        c.copy_from_slice(&w.to_be_bytes());
    }
}

/// One message at a time through the `sha2` block function.
fn serial(g: &Group, s: &Shape, b: &Batch<'_>, out: &mut [u8]) {
    for (l, o) in out.chunks_exact_mut(32).enumerate().take(g.lanes) {
        let mut st = *b.start;
        for j in 0..s.blocks() {
            // SAFETY: Group::block points at 64 readable bytes (staging or the body).
            let blk = unsafe { std::slice::from_raw_parts(g.block(s, b.prefix_len, l, j), 64) };
            compress(&mut st, blk);
        }
        if let Some(outer) = b.outer {
            let inner = st;
            st = *outer;
            compress(&mut st, &outer_block(&inner));
        }
        put(&st, o);
    }
}

/// Up to four messages interleaved through the SHA extensions, as [`serial`] does them one
/// at a time.
#[cfg(target_arch = "x86_64")]
fn shani_group(g: &Group, s: &Shape, b: &Batch<'_>, out: &mut [u8]) {
    fn go<const N: usize>(g: &Group, s: &Shape, b: &Batch<'_>, first: usize, out: &mut [u8]) {
        use super::sha256_shani::compress;
        let mut st = [*b.start; N];
        let plen = b.prefix_len;
        // SAFETY: chosen only where sha256_shani::available(); Group::block points at 64
        // readable bytes (staging or the body).
        unsafe { compress(&mut st, s.blocks(), |m, j| g.block(s, plen, first + m, j)) };
        if let Some(outer) = b.outer {
            let blocks: [[u8; 64]; N] = std::array::from_fn(|m| outer_block(&st[m]));
            st = [*outer; N];
            // SAFETY: as above; the outer blocks are 64 bytes each.
            unsafe { compress(&mut st, 1, |m, _| blocks[m].as_ptr()) };
        }
        for (m, state) in st.iter().enumerate() {
            put(state, &mut out[(first + m) * 32..(first + m + 1) * 32]);
        }
    }
    let mut first = 0;
    while first < g.lanes {
        let step = match g.lanes - first {
            4.. => 4,
            2 | 3 => 2,
            _ => 1,
        };
        match step {
            4 => go::<4>(g, s, b, first, out),
            2 => go::<2>(g, s, b, first, out),
            _ => go::<1>(g, s, b, first, out),
        }
        first += step;
    }
}

/// The SHA-256 round function over lanes of 32-bit words.
trait Lanes: Copy {
    const N: usize;
    fn splat(x: u32) -> Self;
    fn add(self, o: Self) -> Self;
    fn ch(self, f: Self, g: Self) -> Self;
    fn maj(self, b: Self, c: Self) -> Self;
    fn big0(self) -> Self;
    fn big1(self) -> Self;
    fn small0(self) -> Self;
    fn small1(self) -> Self;
    /// The 16 message words of the lanes' blocks at `ptrs`, word `i` of every lane in
    /// vector `i`.
    ///
    /// # Safety
    /// Every pointer addresses 64 readable bytes.
    unsafe fn load(ptrs: &[*const u8; 16]) -> [Self; 16];
    fn store(self, out: &mut [u32; 16]);
}

/// Compress one block (message words `w`) into `st`.
#[inline(always)]
fn rounds<V: Lanes>(st: &mut [V; 8], mut w: [V; 16]) {
    let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *st;
    for t in 0..64 {
        if t >= 16 {
            let x = w[(t - 2) & 15]
                .small1()
                .add(w[(t - 7) & 15])
                .add(w[(t - 15) & 15].small0())
                .add(w[t & 15]);
            w[t & 15] = x;
        }
        let t1 = h
            .add(e.big1())
            .add(e.ch(f, g))
            .add(V::splat(K[t]))
            .add(w[t & 15]);
        let t2 = a.big0().add(a.maj(b, c));
        h = g;
        g = f;
        f = e;
        e = d.add(t1);
        d = c;
        c = b;
        b = a;
        a = t1.add(t2);
    }
    for (s, v) in st.iter_mut().zip([a, b, c, d, e, f, g, h]) {
        *s = s.add(v);
    }
}

/// The lanes of one group: every block, then the outer block where asked, then the digests.
///
/// # Safety
/// The CPU runs `V`'s instructions.
#[inline(always)]
unsafe fn run<V: Lanes>(g: &Group, s: &Shape, b: &Batch<'_>, out: &mut [u8]) {
    let mut st: [V; 8] = b.start.map(V::splat);
    let mut ptrs = [std::ptr::null::<u8>(); 16];
    for j in 0..s.blocks() {
        for (l, p) in ptrs.iter_mut().enumerate().take(V::N) {
            // Idle lanes hash lane 0's block again: real, readable bytes.
            *p = g.block(s, b.prefix_len, if l < g.lanes { l } else { 0 }, j);
        }
        // SAFETY: Group::block points at 64 readable bytes.
        let w = unsafe { V::load(&ptrs) };
        rounds(&mut st, w);
    }
    if let Some(outer) = b.outer {
        let z = V::splat(0);
        let mut w = [z; 16];
        w[..8].copy_from_slice(&st);
        w[8] = V::splat(0x8000_0000);
        w[15] = V::splat((64 + 32) * 8);
        st = outer.map(V::splat);
        rounds(&mut st, w);
    }
    let mut words = [[0u32; 16]; 8];
    for (v, w) in st.iter().zip(words.iter_mut()) {
        v.store(w);
    }
    for (l, o) in out.chunks_exact_mut(32).enumerate().take(g.lanes) {
        for (c, w) in o.chunks_exact_mut(4).zip(&words) {
            c.copy_from_slice(&w[l].to_be_bytes());
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{run, Batch, Group, Lanes, Shape};
    use std::arch::x86_64::*;

    /// Byte order of each 32-bit word reversed (message words are big-endian).
    #[rustfmt::skip]
    static BSWAP: [u8; 64] = [
        3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
        3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
        3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
        3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
    ];

    #[derive(Clone, Copy)]
    pub(super) struct V16(__m512i);

    impl Lanes for V16 {
        const N: usize = 16;
        #[inline(always)]
        fn splat(x: u32) -> Self {
            // SAFETY: only reached from run16 (AVX-512F).
            unsafe { V16(_mm512_set1_epi32(x as i32)) }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            unsafe { V16(_mm512_add_epi32(self.0, o.0)) }
        }
        // vpternlogd truth tables (a = self): 0xca = (a & f) ^ (!a & g), 0xe8 = majority,
        // 0x96 = three-way xor.
        #[inline(always)]
        fn ch(self, f: Self, g: Self) -> Self {
            unsafe { V16(_mm512_ternarylogic_epi32::<0xca>(self.0, f.0, g.0)) }
        }
        #[inline(always)]
        fn maj(self, b: Self, c: Self) -> Self {
            unsafe { V16(_mm512_ternarylogic_epi32::<0xe8>(self.0, b.0, c.0)) }
        }
        #[inline(always)]
        fn big0(self) -> Self {
            let x = self.0;
            unsafe {
                V16(_mm512_ternarylogic_epi32::<0x96>(
                    _mm512_ror_epi32::<2>(x),
                    _mm512_ror_epi32::<13>(x),
                    _mm512_ror_epi32::<22>(x),
                ))
            }
        }
        #[inline(always)]
        fn big1(self) -> Self {
            let x = self.0;
            unsafe {
                V16(_mm512_ternarylogic_epi32::<0x96>(
                    _mm512_ror_epi32::<6>(x),
                    _mm512_ror_epi32::<11>(x),
                    _mm512_ror_epi32::<25>(x),
                ))
            }
        }
        #[inline(always)]
        fn small0(self) -> Self {
            let x = self.0;
            unsafe {
                V16(_mm512_ternarylogic_epi32::<0x96>(
                    _mm512_ror_epi32::<7>(x),
                    _mm512_ror_epi32::<18>(x),
                    _mm512_srli_epi32::<3>(x),
                ))
            }
        }
        #[inline(always)]
        fn small1(self) -> Self {
            let x = self.0;
            unsafe {
                V16(_mm512_ternarylogic_epi32::<0x96>(
                    _mm512_ror_epi32::<17>(x),
                    _mm512_ror_epi32::<19>(x),
                    _mm512_srli_epi32::<10>(x),
                ))
            }
        }
        #[inline(always)]
        unsafe fn load(ptrs: &[*const u8; 16]) -> [Self; 16] {
            unsafe {
                let mask = _mm512_loadu_si512(BSWAP.as_ptr().cast());
                let r: [__m512i; 16] = std::array::from_fn(|i| {
                    _mm512_shuffle_epi8(_mm512_loadu_si512(ptrs[i].cast()), mask)
                });
                // 32-bit then 64-bit interleaves: s[4g + m], 128-bit chunk k, holds word
                // 4k + m of lanes 4g..4g+3.
                let mut s = [r[0]; 16];
                for g in 0..4 {
                    let i = 4 * g;
                    let t0 = _mm512_unpacklo_epi32(r[i], r[i + 1]);
                    let t1 = _mm512_unpackhi_epi32(r[i], r[i + 1]);
                    let t2 = _mm512_unpacklo_epi32(r[i + 2], r[i + 3]);
                    let t3 = _mm512_unpackhi_epi32(r[i + 2], r[i + 3]);
                    s[i] = _mm512_unpacklo_epi64(t0, t2);
                    s[i + 1] = _mm512_unpackhi_epi64(t0, t2);
                    s[i + 2] = _mm512_unpacklo_epi64(t1, t3);
                    s[i + 3] = _mm512_unpackhi_epi64(t1, t3);
                }
                // Then a 4x4 transpose of 128-bit chunks across s[m], s[4+m], s[8+m], s[12+m].
                let mut w = [V16(r[0]); 16];
                for m in 0..4 {
                    let (a, b, c, d) = (s[m], s[4 + m], s[8 + m], s[12 + m]);
                    let u0 = _mm512_shuffle_i32x4::<0x44>(a, b);
                    let u1 = _mm512_shuffle_i32x4::<0xee>(a, b);
                    let u2 = _mm512_shuffle_i32x4::<0x44>(c, d);
                    let u3 = _mm512_shuffle_i32x4::<0xee>(c, d);
                    w[m] = V16(_mm512_shuffle_i32x4::<0x88>(u0, u2));
                    w[4 + m] = V16(_mm512_shuffle_i32x4::<0xdd>(u0, u2));
                    w[8 + m] = V16(_mm512_shuffle_i32x4::<0x88>(u1, u3));
                    w[12 + m] = V16(_mm512_shuffle_i32x4::<0xdd>(u1, u3));
                }
                w
            }
        }
        #[inline(always)]
        fn store(self, out: &mut [u32; 16]) {
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), self.0) }
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct V8(__m256i);

    macro_rules! rotr8 {
        ($x:expr, $n:literal) => {
            _mm256_or_si256(
                _mm256_srli_epi32::<$n>($x),
                _mm256_slli_epi32::<{ 32 - $n }>($x),
            )
        };
    }

    impl Lanes for V8 {
        const N: usize = 8;
        #[inline(always)]
        fn splat(x: u32) -> Self {
            // SAFETY: only reached from run8 (AVX2).
            unsafe { V8(_mm256_set1_epi32(x as i32)) }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            unsafe { V8(_mm256_add_epi32(self.0, o.0)) }
        }
        #[inline(always)]
        fn ch(self, f: Self, g: Self) -> Self {
            // g ^ (a & (f ^ g))
            unsafe {
                V8(_mm256_xor_si256(
                    g.0,
                    _mm256_and_si256(self.0, _mm256_xor_si256(f.0, g.0)),
                ))
            }
        }
        #[inline(always)]
        fn maj(self, b: Self, c: Self) -> Self {
            // (a & b) | (c & (a | b))
            unsafe {
                V8(_mm256_or_si256(
                    _mm256_and_si256(self.0, b.0),
                    _mm256_and_si256(c.0, _mm256_or_si256(self.0, b.0)),
                ))
            }
        }
        #[inline(always)]
        fn big0(self) -> Self {
            let x = self.0;
            unsafe {
                V8(_mm256_xor_si256(
                    _mm256_xor_si256(rotr8!(x, 2), rotr8!(x, 13)),
                    rotr8!(x, 22),
                ))
            }
        }
        #[inline(always)]
        fn big1(self) -> Self {
            let x = self.0;
            unsafe {
                V8(_mm256_xor_si256(
                    _mm256_xor_si256(rotr8!(x, 6), rotr8!(x, 11)),
                    rotr8!(x, 25),
                ))
            }
        }
        #[inline(always)]
        fn small0(self) -> Self {
            let x = self.0;
            unsafe {
                V8(_mm256_xor_si256(
                    _mm256_xor_si256(rotr8!(x, 7), rotr8!(x, 18)),
                    _mm256_srli_epi32::<3>(x),
                ))
            }
        }
        #[inline(always)]
        fn small1(self) -> Self {
            let x = self.0;
            unsafe {
                V8(_mm256_xor_si256(
                    _mm256_xor_si256(rotr8!(x, 17), rotr8!(x, 19)),
                    _mm256_srli_epi32::<10>(x),
                ))
            }
        }
        #[inline(always)]
        unsafe fn load(ptrs: &[*const u8; 16]) -> [Self; 16] {
            unsafe {
                let mask = _mm256_loadu_si256(BSWAP.as_ptr().cast());
                let mut w = [V8(_mm256_setzero_si256()); 16];
                // Words 0..8 then 8..16 of the eight lanes, each an 8x8 transpose.
                for half in 0..2 {
                    let r: [__m256i; 8] = std::array::from_fn(|i| {
                        _mm256_shuffle_epi8(_mm256_loadu_si256(ptrs[i].add(32 * half).cast()), mask)
                    });
                    let mut s = [r[0]; 8];
                    for g in 0..2 {
                        let i = 4 * g;
                        let t0 = _mm256_unpacklo_epi32(r[i], r[i + 1]);
                        let t1 = _mm256_unpackhi_epi32(r[i], r[i + 1]);
                        let t2 = _mm256_unpacklo_epi32(r[i + 2], r[i + 3]);
                        let t3 = _mm256_unpackhi_epi32(r[i + 2], r[i + 3]);
                        s[i] = _mm256_unpacklo_epi64(t0, t2);
                        s[i + 1] = _mm256_unpackhi_epi64(t0, t2);
                        s[i + 2] = _mm256_unpacklo_epi64(t1, t3);
                        s[i + 3] = _mm256_unpackhi_epi64(t1, t3);
                    }
                    for m in 0..4 {
                        w[8 * half + m] = V8(_mm256_permute2x128_si256::<0x20>(s[m], s[4 + m]));
                        w[8 * half + 4 + m] = V8(_mm256_permute2x128_si256::<0x31>(s[m], s[4 + m]));
                    }
                }
                w
            }
        }
        #[inline(always)]
        fn store(self, out: &mut [u32; 16]) {
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), self.0) }
        }
    }

    /// Sixteen lanes.
    ///
    /// # Safety
    /// AVX-512F and AVX-512BW are available.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn run16(g: &Group, s: &Shape, b: &Batch<'_>, out: &mut [u8]) {
        unsafe { run::<V16>(g, s, b, out) }
    }

    /// Eight lanes.
    ///
    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn run8(g: &Group, s: &Shape, b: &Batch<'_>, out: &mut [u8]) {
        unsafe { run::<V8>(g, s, b, out) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::random_bytes;
    use super::*;
    use sha2::Digest;

    /// Every length a staged block takes, at every offset, copies exactly its bytes and
    /// touches none around them.
    #[test]
    fn copy_small_copies_exactly() {
        let src = random_bytes(80, 5);
        for n in 0..=64 {
            for at in [0usize, 1, 7, 16 - n.min(16)] {
                let mut dst = [0xeeu8; 80];
                copy_small(&mut dst[at..at + n], &src[3..3 + n]);
                assert_eq!(&dst[at..at + n], &src[3..3 + n], "{n} at {at}");
                assert!(dst[..at].iter().chain(&dst[at + n..]).all(|&b| b == 0xee));
            }
        }
    }

    /// HMAC of `parts` with `md`, by OpenSSL (an implementation independent of ours).
    pub(crate) fn openssl_hmac(
        md: openssl::hash::MessageDigest,
        key: &[u8],
        parts: &[&[u8]],
    ) -> Vec<u8> {
        use openssl::{pkey::PKey, sign::Signer};
        let k = PKey::hmac(key).unwrap();
        let mut s = Signer::new(md, &k).unwrap();
        for p in parts {
            s.update(p).unwrap();
        }
        s.sign_to_vec().unwrap()
    }

    /// Every kernel against `sha2` and OpenSSL's HMAC: random prefix and body lengths
    /// (messages shorter than a block, ending in one or two padding blocks), batch sizes
    /// around the lane widths, bodies at odd addresses, random keys of every length class,
    /// and a random starting state with a random absorbed length (sha2 fed the bytes that
    /// state stands for).
    #[test]
    fn every_kernel_matches_sha2_and_hmac() {
        let mut seed = 11u64;
        for round in 0..60 {
            seed += 1;
            let r = random_bytes(16, seed);
            let plen = r[0] as usize % 40;
            let blen = [0usize, 1, 23, 40, 55, 64, 100, 512, 4096][r[1] as usize % 9]
                .max(if plen == 0 { 1 } else { 0 });
            let n = [1usize, 2, 7, 8, 9, 15, 16, 17, 31, 33][r[2] as usize % 10];
            let align = r[3] as usize % 7;
            let data = random_bytes(align + n * blen, seed * 7);
            let bodies = &data[align..];
            let prefixes = random_bytes(n * plen, seed * 13);
            // HMAC with a key of 1..100 bytes, else plain SHA-256 from IV or after a
            // random 64k-byte lead-in.
            let key = random_bytes(1 + r[4] as usize % 100, seed * 17);
            let lead = random_bytes(64 * (r[5] as usize % 3), seed * 19);
            let hmac = round % 2 == 0;
            let hs = HmacState::new(&key);
            let mut start = IV;
            for blk in lead.chunks_exact(64) {
                compress(&mut start, blk);
            }
            let b = Batch {
                start: if hmac { &hs.inner } else { &start },
                absorbed: if hmac { 64 } else { lead.len() as u64 },
                prefixes: &prefixes,
                prefix_len: plen,
                bodies,
                body_len: blen,
                outer: hmac.then_some(&hs.outer),
            };
            let mut want = Vec::new();
            for i in 0..n {
                let (p, m) = (
                    &prefixes[i * plen..(i + 1) * plen],
                    &bodies[i * blen..(i + 1) * blen],
                );
                if hmac {
                    want.extend_from_slice(&openssl_hmac(
                        openssl::hash::MessageDigest::sha256(),
                        &key,
                        &[p, m],
                    ));
                } else {
                    let d = sha2::Sha256::new()
                        .chain_update(&lead)
                        .chain_update(p)
                        .chain_update(m)
                        .finalize();
                    want.extend_from_slice(&d);
                }
            }
            for (name, got) in hash_all_kernels(&b) {
                assert!(
                    got == want,
                    "{name}: round {round} hmac {hmac} prefix {plen} body {blen} n {n} \
                     align {align} key {} lead {}",
                    key.len(),
                    lead.len()
                );
            }
        }
    }

    /// RFC 4231's HMAC-SHA-256 test cases 1-4, 6 and 7 (5 is truncated output) on every
    /// kernel, each message split into a prefix and a body, in batches of 1, 8 and 16.
    #[test]
    fn rfc4231_on_every_kernel() {
        let aa131 = vec![0xaa; 131];
        let cases: [(Vec<u8>, Vec<u8>, &str); 6] = [
            (
                vec![0x0b; 20],
                b"Hi There".to_vec(),
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                vec![0xaa; 20],
                vec![0xdd; 50],
                "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
            ),
            (
                (1..=25).collect(),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                aa131.clone(),
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                aa131,
                b"This is a test using a larger than block-size key and a larger than \
                  block-size data. The key needs to be hashed before being used by the \
                  HMAC algorithm."
                    .to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (key, msg, want) in cases {
            let hs = HmacState::new(&key);
            for n in [1usize, 8, 16] {
                let plen = 3.min(msg.len());
                let prefixes: Vec<u8> = msg[..plen].repeat(n);
                let bodies: Vec<u8> = msg[plen..].repeat(n);
                let b = Batch {
                    start: &hs.inner,
                    absorbed: 64,
                    prefixes: &prefixes,
                    prefix_len: plen,
                    bodies: &bodies,
                    body_len: msg.len() - plen,
                    outer: Some(&hs.outer),
                };
                for (name, got) in hash_all_kernels(&b) {
                    for d in got.chunks_exact(32) {
                        assert_eq!(hex::encode(d), want, "{name} n {n}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// Best of five: bytes per second of `f` hashing `bytes` per call.
    fn best(bytes: usize, mut f: impl FnMut()) -> f64 {
        (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                for _ in 0..400 {
                    f();
                }
                (400 * bytes) as f64 / t.elapsed().as_secs_f64() / 1e6
            })
            .fold(0.0, f64::max)
    }

    /// Not a check: prints the lane engine against `tape-sha256` on dm-integrity's shape
    /// (8-byte prefix, 512-byte blocks), `cargo test --release --lib sha256_lanes::speed --
    /// --ignored --nocapture`.
    #[test]
    #[ignore]
    fn lanes_against_tape() {
        let data = vec![0x5au8; 64 * 512];
        // A different prefix per message, as dm-integrity's sector numbers.
        let prefixes: Vec<u8> = (0..64 * 8).map(|i| (i * 37 % 251) as u8).collect();
        let mut out = vec![0u8; 64 * 32];
        let hs = HmacState::new(b"key");
        for n in [8usize, 16, 64] {
            let o = &mut out[..n * 32];
            let batch = |hmac: bool| Batch {
                start: if hmac { &hs.inner } else { &IV },
                absorbed: if hmac { 64 } else { 0 },
                prefixes: &prefixes[..n * 8],
                prefix_len: 8,
                bodies: &data[..n * 512],
                body_len: 512,
                outer: hmac.then_some(&hs.outer),
            };
            let mut line = format!("batch {n}:");
            for (name, k) in hash_all_kernels(&batch(false))
                .into_iter()
                .map(|(name, _)| name)
                .zip([Kernel::Serial, Kernel::Avx2, Kernel::Avx512, Kernel::ShaNi])
            {
                let sha = best(n * 512, || hash_with(k, &batch(false), o));
                let mac = best(n * 512, || hash_with(k, &batch(true), o));
                line += &format!(" {name} sha256 {sha:.0} hmac {mac:.0};");
            }
            let tape = best(n * 512, || {
                super::super::sha256_mb::hash_prefixed_blocks(
                    &prefixes[..n * 8],
                    8,
                    &data[..n * 512],
                    512,
                    o,
                )
            });
            println!(
                "{line} tape ({}) sha256 {tape:.0} MB/s",
                super::super::sha256_mb::backend()
            );
        }
    }
}
