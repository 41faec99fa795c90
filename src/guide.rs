// "Writing a runtime on pollshot": the text is docs/guide.md, rendered here by
// rustdoc; its code blocks run as doctests.

#![doc = include_str!("../docs/guide.md")]
