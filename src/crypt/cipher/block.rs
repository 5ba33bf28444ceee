//! The block-cipher contract under the generic modes (XTS, LRW, CBC, ESSIV): a leaf, so a
//! cipher written here (twofish) and the factory that names every cipher (`block_cipher`) do
//! not import each other.

/// A keyed 128-bit block cipher working on whole blocks in place (ECB).
pub(crate) trait BlockCipher: Send + Sync {
    /// Encrypt each block in place.
    fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]);
    /// Decrypt each block in place.
    fn decrypt_blocks(&self, blocks: &mut [[u8; 16]]);
    /// What runs the blocks (`status`, benchmarks).
    fn implementation(&self) -> &'static str {
        "portable"
    }
}
