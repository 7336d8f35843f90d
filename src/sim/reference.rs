//! Image references as the simulated node reads them: the tag of `name[:tag][@digest]`, with
//! the grammar of distribution/reference (`reference.go`: `ReferenceRegexp`, `TagRegexp`),
//! which Talos and the kubelet parse references with. Written here, apart from medea's own
//! `image` module, so that a mistake in the client's parser is not copied into the simulator
//! that tests it.

/// The tag of `reference`, if it has one: the part after the last `:` of its last path
/// component (a registry's `host:port/` comes before a `/`), any `@digest` dropped. A tag that
/// is not `[\w][\w.-]{0,127}` is no tag (distribution/reference refuses such a reference).
pub(crate) fn tag_of(reference: &str) -> Option<&str> {
    let name_and_tag = match reference.split_once('@') {
        Some((before, _digest)) => before,
        None => reference,
    };
    let last_component = name_and_tag.rfind('/').map_or(0, |i| i + 1);
    let (_, tag) = name_and_tag[last_component..].rsplit_once(':')?;
    valid_tag(tag).then_some(tag)
}

/// distribution/reference `TagRegexp`: `[\w][\w.-]{0,127}`.
fn valid_tag(tag: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = tag.chars();
    chars.next().is_some_and(word)
        && tag.len() <= 128
        && chars.all(|c| word(c) || c == '.' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_follow_the_distribution_reference_grammar() {
        assert_eq!(
            tag_of("ghcr.io/siderolabs/installer:v1.13.9"),
            Some("v1.13.9")
        );
        assert_eq!(
            tag_of("registry.k8s.io/kube-apiserver:v1.34.1@sha256:abcd"),
            Some("v1.34.1")
        );
        // A registry port is not a tag.
        assert_eq!(tag_of("localhost:5000/installer"), None);
        assert_eq!(tag_of("localhost:5000/installer:v1.12.4"), Some("v1.12.4"));
        assert_eq!(
            tag_of("factory.talos.dev/metal-installer/376567988ad3:v1.14.6"),
            Some("v1.14.6")
        );
        // No tag, an empty tag, or one outside `[\w][\w.-]{0,127}`.
        assert_eq!(tag_of("ghcr.io/siderolabs/installer"), None);
        assert_eq!(tag_of("ghcr.io/siderolabs/installer:"), None);
        assert_eq!(tag_of("installer:-v1"), None);
        assert_eq!(tag_of("installer:v1+build"), None);
        assert_eq!(
            tag_of(&format!("installer:{}", "a".repeat(128))).map(str::len),
            Some(128)
        );
        assert_eq!(tag_of(&format!("installer:{}", "a".repeat(129))), None);
    }
}
