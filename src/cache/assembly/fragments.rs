//! The fragments a payload is assembled from: one application's encoding as a deflate piece
//! with its CRC-32 (and its text while identity forms are wanted), and which of them are due
//! for a refresh as their lease timestamps age.
//!
//! Each piece but the first is compressed after the last [`WINDOW`] bytes of the fragment before
//! it (see [`gzip::deflate_after`]): the first instance of an application then compresses as well
//! as the others, and the document about as well as in one stream. A piece stays valid while the
//! fragment before it is the one it was compressed after; [`chain`] recompresses those whose
//! predecessor changed (a write recompresses its own application and the next one).

use super::*;

/// One application's part of the document.
pub(super) struct Fragment {
    /// The version of the application (or of its part of the delta) the view was taken at.
    pub(super) version: u64,
    /// When the view was taken (the age of its lease timestamps).
    pub(super) taken: Instant,
    pub(super) instances: usize,
    /// Whether its application starts a group of pieces joined together ([`body::starts_group`]).
    pub(super) starts_group: bool,
    /// The text followed by the separator, while identity forms are kept (and from encoding
    /// until the piece is compressed).
    pub(super) text: Option<Bytes>,
    /// The text (without separator) as a deflate piece ending with an empty stored block,
    /// compressed after `dict` (empty until [`chain`] compresses it).
    pub(super) deflated: Bytes,
    /// What the piece was compressed after: the previous fragment's `tail`, shared with it
    /// (empty for the first); `None` until it is compressed.
    pub(super) dict: Option<Bytes>,
    /// The last [`WINDOW`] bytes of the text and the separator, a copy: what the next fragment's
    /// piece is compressed after.
    pub(super) tail: Bytes,
    /// Of the text without and with the separator.
    pub(super) plain: Sum,
    pub(super) separated: Sum,
}

impl Fragment {
    /// The application's text; its piece is compressed by [`chain`], once the fragment before
    /// it is known.
    pub(super) fn encode(view: &AppView, version: u64, taken: Instant, format: Format) -> Fragment {
        let mut text = codec::encode_app_fragment(view, format);
        let plain = Sum::of(&text);
        let sep = codec::separator(format);
        text.extend_from_slice(sep);
        text.shrink_to_fit();
        let tail = Bytes::copy_from_slice(&text[text.len().saturating_sub(WINDOW)..]);
        Fragment {
            version,
            taken,
            instances: view.instances.len(),
            starts_group: super::body::starts_group(&view.name),
            text: Some(Bytes::from(text)),
            deflated: Bytes::new(),
            dict: None,
            tail,
            plain,
            separated: plain.then(Sum::of(sep)),
        }
    }

    /// The text with the separator, from the deflate piece when it was not kept.
    pub(super) fn text_or_inflate(&self, format: Format) -> Bytes {
        if let Some(t) = &self.text {
            return t.clone();
        }
        let dict = self.dict.as_deref().unwrap_or_default();
        let mut text = gzip::inflate_after(dict, &self.deflated).unwrap_or_default();
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
    /// The gzip pieces joined in groups at the last build ([`body::gzip_body`]).
    pub(super) groups: super::body::Groups,
}

/// How many bytes at the end of a fragment the next one's piece is compressed after: about one
/// instance of a typical registration, which is where most of what a piece can borrow is. An
/// experiment with zlib on documents shaped like the bench's (500 applications of 20) gave 1.01×
/// the size of the whole document in one stream with 1 KiB, 1.02× with 2 KiB and 1.04× with
/// 4 KiB (and 1.29× with 512 bytes, less than one instance); a longer window also costs memory
/// per application.
pub(super) const WINDOW: usize = 1024;

/// Whether `a` and `b` are the same shared bytes (a piece's dictionary and a tail, or two pieces).
pub(super) fn shared(a: &Bytes, b: &Bytes) -> bool {
    a.len() == b.len() && (a.is_empty() || a.as_ptr() == b.as_ptr())
}

/// Compresses every piece that is not compressed yet or whose predecessor changed, each after
/// the tail of the fragment now before it; then drops texts that are not to be kept. Returns
/// how many pieces it compressed.
pub(super) fn chain(fragments: &mut Fragments, format: Format, keep_text: bool) -> usize {
    let sep = codec::separator(format);
    let mut before = Bytes::new();
    let mut compressed = 0;
    for f in fragments.map.values_mut() {
        let fresh = match &f.dict {
            None => false,
            Some(_) if crate::mutants::on("stale-piece-window") => true,
            Some(d) if shared(d, &before) => true,
            Some(d) if d[..] == before[..] => {
                // The predecessor was taken again but its last bytes did not change (its last
                // instance did not): this piece stays valid. Shared from now on, so that the
                // next build compares pointers.
                f.dict = Some(before.clone());
                true
            }
            Some(_) => false,
        };
        if !fresh {
            let text = f.text_or_inflate(format);
            let body = &text[..text.len() - sep.len()];
            let mut piece = gzip::deflate_after(&before, body, LEVEL);
            piece.shrink_to_fit();
            f.deflated = Bytes::from(piece);
            f.dict = Some(before.clone());
            compressed += 1;
        }
        if !keep_text {
            f.text = None;
        }
        before = f.tail.clone();
    }
    compressed
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
