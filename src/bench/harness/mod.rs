//! How a benchmark measures, whatever it measures: the scenarios (the sibling `scenarios`
//! module) only say what to set up and which sides to put side by side.

pub mod fio;
pub mod model;
pub mod process;
pub mod report;
pub mod rw;
pub mod table;
pub mod tools;
