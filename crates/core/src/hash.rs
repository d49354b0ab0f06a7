//! The one hash that names and places things: worker ids, consistent-hash keys, prefix blocks.
//!
//! Why not std's `DefaultHasher`: Rust does not fix its algorithm, so a toolchain upgrade could
//! rename every worker (and its metric series), reshuffle sticky sessions, and make two replicas
//! built by different compilers route the same key to different workers. This is SipHash-1-3 with
//! the all-zero key over exactly the bytes given — a specified algorithm, pinned by the test
//! vectors below, which must never change.

use std::hash::Hasher;

use siphasher::sip::SipHasher13;

/// The stable hash of `bytes`.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0, 0);
    h.write(bytes);
    h.finish()
}

/// The stable hash of `block` chained after `previous` (its 8 bytes, little-endian, come first),
/// so a block's hash names the whole prefix up to and including it.
pub fn chain_hash(previous: u64, block: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0, 0);
    h.write(&previous.to_le_bytes());
    h.write(block);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These values are the contract: worker ids (`w` + the low 32 bits in hex), sticky routing
    /// and prefix affinity depend on them across releases and replicas. A change here renames
    /// every worker.
    #[test]
    fn test_vectors_are_pinned() {
        assert_eq!(stable_hash(b""), 0xd1fb_a762_150c_532c);
        assert_eq!(stable_hash(b"http://127.0.0.1:8001"), STABLE_URL);
        assert_eq!(stable_hash(b"session-42"), STABLE_SESSION);
        assert_eq!(chain_hash(0, b"0123456789abcdef"), CHAINED);
    }

    // Computed with an independent SipHash-1-3 (a few lines of Python, not this crate).
    const STABLE_URL: u64 = 0xe394_9ce9_208c_e5ca;
    const STABLE_SESSION: u64 = 0x30d0_d31b_0d81_7541;
    const CHAINED: u64 = 0xc66f_be96_9a79_4e8d;

    #[test]
    fn a_chained_hash_depends_on_what_came_before() {
        assert_ne!(chain_hash(1, b"block"), chain_hash(2, b"block"));
        assert_ne!(chain_hash(0, b"block"), stable_hash(b"block"));
    }
}
