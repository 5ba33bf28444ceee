//! Lists of block (or sector) numbers printed as ranges, so that every corrupt block is named
//! even when there are thousands: "3, 7-9".

/// `numbers` (sorted) as ranges of consecutive entries, where consecutive means `step` apart
/// (1 for block numbers; sectors per block for the sector numbers of blocks).
pub fn ranges(numbers: &[u64], step: u64) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let mut j = i;
        while j + 1 < numbers.len() && numbers[j + 1] == numbers[j] + step {
            j += 1;
        }
        out.push(if i == j {
            numbers[i].to_string()
        } else {
            format!("{}-{}", numbers[i], numbers[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_become_ranges() {
        assert_eq!(super::ranges(&[3, 7, 8, 9, 12], 1), "3, 7-9, 12");
        assert_eq!(super::ranges(&[3], 1), "3");
        assert_eq!(super::ranges(&[0, 1, 2, 5, 7, 8], 1), "0-2, 5, 7-8");
        assert_eq!(super::ranges(&[0, 8, 16, 40], 8), "0-16, 40");
        assert_eq!(super::ranges(&[], 1), "");
    }
}
