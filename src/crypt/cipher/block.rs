//! The block-cipher contract under the generic modes (XTS, LRW, CBC, ESSIV): a leaf, so a
//! cipher written here (twofish) and the factory that names every cipher (`block_cipher`) do
//! not import each other.

/// A keyed 128-bit block cipher working on whole blocks in place (ECB).
pub(crate) trait BlockCipher: Send + Sync {
    /// Encrypt each block in place.
    fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]);
    /// Decrypt each block in place.
    fn decrypt_blocks(&self, blocks: &mut [[u8; 16]]);
    /// XTS over the first blocks of one sector in a fused wide path (tweak XORs in
    /// registers, tweaks made sixteen at a time), `t` the first block's tweak (E_K2(IV) as a
    /// little-endian integer). Returns how many leading blocks it handled; the caller runs
    /// the rest through [`BlockCipher::encrypt_blocks`]. The default handles none.
    fn xts_prefix(&self, _blocks: &mut [[u8; 16]], _t: u128, _decrypt: bool) -> usize {
        0
    }
    /// What runs the blocks (`status`, benchmarks).
    fn implementation(&self) -> &'static str {
        "portable"
    }
}
