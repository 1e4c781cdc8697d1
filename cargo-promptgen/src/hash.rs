//! SHA-256 as the lock writes it: 64 lower-case hex digits. The lock's keys, its files'
//! hashes, the cache's object names and the bucket's keys are all of this form, and only
//! names of this form ever become paths or keys.

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest.iter() {
        hex.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        hex.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    hex
}

/// Whether `text` is a SHA-256 as the lock writes it: 64 lower-case hex digits.
pub fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The first 12 characters of a hash, for messages.
pub fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_a_known_vector() {
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn only_64_lower_case_hex_digits_are_a_hash() {
        assert!(is_sha256(&sha256_hex(b"x")));
        assert!(!is_sha256(&"A".repeat(64)) && !is_sha256("../x") && !is_sha256(&"a".repeat(63)));
        assert_eq!(short(&sha256_hex(b"abc")), "ba7816bf8f01");
    }
}
