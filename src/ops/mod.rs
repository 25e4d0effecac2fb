//! The commands an operator runs besides `run`: `check` (a configuration, a request,
//! the store), `drill` and `keys`.

pub mod check;
pub mod drill;
pub mod keys;
