//! Placeholder of the request classifier (the `classify` branch replaces it).
#![allow(dead_code)]

use hyper::header::HeaderName;
use hyper::HeaderMap;
use protocol::dimensions::{Dimensions, MAX_REFERRER_LEN};

pub(crate) use crate::config::Recorded;

pub(crate) struct Classifier {
    recorded: Recorded,
    country_header: Option<HeaderName>,
}

pub(crate) struct Classified<'b> {
    pub(crate) dimensions: Dimensions<'b>,
    pub(crate) country_rejected: bool,
}

impl Classifier {
    pub(crate) fn new(recorded: Recorded, country_header: Option<HeaderName>) -> Classifier {
        Classifier {
            recorded,
            country_header,
        }
    }

    pub(crate) fn classify<'b>(
        &self,
        _headers: &HeaderMap,
        _buf: &'b mut [u8; MAX_REFERRER_LEN],
    ) -> Classified<'b> {
        Classified {
            dimensions: Dimensions::default(),
            country_rejected: false,
        }
    }
}
