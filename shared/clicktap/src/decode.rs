//! `clicktap decode`: one datagram's bytes, explained.

use std::path::PathBuf;

use super::show::{self, Reading};
use super::{hex, read_all, say, TapError};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// File holding one datagram's bytes; `-` (the default) reads stdin.
    #[arg(default_value = "-", value_name = "FILE|-")]
    input: PathBuf,
    /// The input is hex text (whitespace and a leading 0x ignored, as from `xxd -p`), not
    /// raw bytes.
    #[arg(long)]
    hex: bool,
    /// Print the datagram as one JSON object (each click with its time and the dimensions it
    /// carries), not as text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<(), TapError> {
    let input = read_all(&args.input)?;
    let bytes = if args.hex {
        hex::parse(&String::from_utf8_lossy(&input))?
    } else {
        input
    };
    match show::judge(&bytes, bytes.len()) {
        Reading::Datagram(batch) if args.json => {
            say(&show::batch_details_json(&batch, bytes.len()).to_string())
        }
        Reading::Datagram(batch) => say(show::batch_details(&batch, bytes.len()).trim_end()),
        Reading::Resync(resync) if args.json => {
            say(&show::resync_json(&resync, bytes.len()).to_string())
        }
        Reading::Resync(resync) => say(&format!(
            "valid resync, {} bytes\nsender:        {}\nfirst:         {}\nclicks_before: {}",
            bytes.len(),
            resync.sender,
            resync.first,
            resync.clicks_before
        )),
        Reading::Rejected { reason, error } => Err(TapError::Invalid {
            len: bytes.len(),
            reason,
            error,
            head: hex::head(&bytes),
        }),
    }
}
