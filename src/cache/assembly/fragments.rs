//! The fragments a payload is assembled from: one application's encoding as a deflate piece
//! with its CRC-32 (and its text while identity forms are wanted), and which of them are due
//! for a refresh as their lease timestamps age.

use super::*;

/// One application's part of the document.
pub(super) struct Fragment {
    /// The version of the application (or of its part of the delta) the view was taken at.
    pub(super) version: u64,
    /// When the view was taken (the age of its lease timestamps).
    pub(super) taken: Instant,
    pub(super) instances: usize,
    /// The text followed by the separator, while identity forms are kept.
    pub(super) text: Option<Bytes>,
    /// The text (without separator) as a deflate piece ending with an empty stored block.
    pub(super) deflated: Bytes,
    /// Of the text without and with the separator.
    pub(super) plain: Sum,
    pub(super) separated: Sum,
}

impl Fragment {
    pub(super) fn encode(view: &AppView, version: u64, taken: Instant, format: Format, keep_text: bool) -> Fragment {
        let mut text = codec::encode_app_fragment(view, format);
        let plain = Sum::of(&text);
        let mut deflated = gzip::deflate(&text, LEVEL);
        deflated.shrink_to_fit();
        let sep = codec::separator(format);
        Fragment {
            version,
            taken,
            instances: view.instances.len(),
            text: keep_text.then(|| {
                text.extend_from_slice(sep);
                text.shrink_to_fit();
                Bytes::from(text)
            }),
            deflated: Bytes::from(deflated),
            plain,
            separated: plain.then(Sum::of(sep)),
        }
    }

    /// The text with the separator, from the deflate piece when it was not kept.
    pub(super) fn text_or_inflate(&self, format: Format) -> Bytes {
        if let Some(t) = &self.text {
            return t.clone();
        }
        let mut text = gzip::inflate(&self.deflated).unwrap_or_default();
        text.extend_from_slice(codec::separator(format));
        Bytes::from(text)
    }
}

/// The builder's own state: only a build touches it.
#[derive(Default)]
pub(super) struct Fragments {
    /// The registry version every fragment is valid for (0: none yet).
    pub(super) built: u64,
    pub(super) map: BTreeMap<Arc<str>, Fragment>,
}

/// Applications' fresh views, with their versions (`None`: the application is gone).
pub(super) type Views = Vec<(Arc<str>, Option<(AppView, u64)>)>;

/// The applications whose fragments are due for a refresh, oldest first, up to the budget
/// (at least one).
pub(super) fn aged(fragments: &Fragments, tuning: &Tuning) -> Vec<Arc<str>> {
    let now = Instant::now();
    let mut due: Vec<(Instant, &Arc<str>, usize)> = fragments
        .map
        .iter()
        .filter(|(_, f)| now.duration_since(f.taken) >= tuning.refresh_after)
        .map(|(n, f)| (f.taken, n, f.instances))
        .collect();
    if due.is_empty() {
        return Vec::new();
    }
    due.sort_by_key(|(t, _, _)| *t);
    let mut budget = tuning.refresh_budget;
    let mut out = Vec::new();
    for (_, name, instances) in due {
        if !out.is_empty() && instances > budget {
            break;
        }
        budget = budget.saturating_sub(instances);
        out.push(name.clone());
    }
    out
}
