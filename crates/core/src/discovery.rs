//! Service discovery's decision: what a source's new listing changes in the fleet.
//!
//! A source (a file, DNS, Kubernetes) lists workers by URL with the spec each should run with.
//! Each time it lists them again, the gateway compares the listing with the one it acted on last
//! and registers the new URLs, re-registers those whose spec changed, and drains the ones no
//! longer listed — nothing else, so a listing that did not change touches no worker.
//!
//! The spec type is a parameter: the core knows URLs and equality, not what a spec holds.

use std::collections::BTreeMap;

/// What one listing changes, relative to the previous one, each list in URL order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes<S> {
    /// Listed now, not before: register.
    pub add: Vec<(String, S)>,
    /// Listed in both with a different spec: register again under the same worker.
    pub replace: Vec<(String, S)>,
    /// Listed before, not now: drain, then remove.
    pub remove: Vec<String>,
}

impl<S> Changes<S> {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.replace.is_empty() && self.remove.is_empty()
    }
}

/// The changes that take the fleet from `before` to `now` (both keyed by worker URL).
pub fn diff<S: PartialEq + Clone>(
    before: &BTreeMap<String, S>,
    now: &BTreeMap<String, S>,
) -> Changes<S> {
    let mut changes = Changes {
        add: Vec::new(),
        replace: Vec::new(),
        remove: Vec::new(),
    };
    for (url, spec) in now {
        match before.get(url) {
            None => changes.add.push((url.clone(), spec.clone())),
            Some(old) if old != spec => changes.replace.push((url.clone(), spec.clone())),
            Some(_) => {}
        }
    }
    changes.remove = before
        .keys()
        .filter(|url| !now.contains_key(*url))
        .cloned()
        .collect();
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn listing(entries: &[(&str, u32)]) -> BTreeMap<String, u32> {
        entries.iter().map(|(u, s)| (u.to_string(), *s)).collect()
    }

    #[test]
    fn an_unchanged_listing_changes_nothing() {
        let l = listing(&[("http://a", 1), ("http://b", 2)]);
        assert!(diff(&l, &l).is_empty());
    }

    #[test]
    fn new_urls_are_added_changed_specs_replaced_missing_urls_removed() {
        let before = listing(&[("http://a", 1), ("http://b", 2), ("http://c", 3)]);
        let now = listing(&[("http://a", 1), ("http://b", 5), ("http://d", 4)]);
        let c = diff(&before, &now);
        assert_eq!(c.add, vec![("http://d".to_string(), 4)]);
        assert_eq!(c.replace, vec![("http://b".to_string(), 5)]);
        assert_eq!(c.remove, vec!["http://c".to_string()]);
    }

    #[test]
    fn an_empty_listing_removes_everything_and_the_first_adds_everything() {
        let some = listing(&[("http://a", 1), ("http://b", 2)]);
        let none = BTreeMap::new();
        assert_eq!(diff(&some, &none).remove.len(), 2);
        assert_eq!(diff(&none, &some).add.len(), 2);
    }

    proptest! {
        /// Applying the changes to `before` gives exactly `now`.
        #[test]
        fn applying_the_changes_reaches_the_new_listing(
            before in proptest::collection::btree_map("[a-e]", 0u8..3, 0..5),
            now in proptest::collection::btree_map("[a-e]", 0u8..3, 0..5),
        ) {
            let c = diff(&before, &now);
            let mut applied = before.clone();
            for url in &c.remove {
                prop_assert!(applied.remove(url).is_some());
            }
            for (url, spec) in c.replace {
                prop_assert!(applied.insert(url, spec).is_some());
            }
            for (url, spec) in c.add {
                prop_assert!(applied.insert(url, spec).is_none());
            }
            prop_assert_eq!(applied, now);
        }
    }
}
