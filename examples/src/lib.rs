//! Nothing here: the examples are the `[[example]]` targets beside this folder.
