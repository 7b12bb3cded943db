-- Where each sender's acknowledgements go: the path of its socket (a redirector's
-- --ack-socket), NULL for a sender without one (clicktap send) and for rows from before this
-- migration; and the uid the collector saw sending from there (65534 for every sender under
-- the shipped unit's PrivateUsers=yes). A collector that starts knows from them whose each
-- sender id is: only a datagram from that address by that user (or from an address the
-- sender moved to, by the rules of docs/security.md) speaks for it. Without them, the first
-- process to send a known id after a collector restart took it, and the redirector whose id
-- it was was refused for good.
ALTER TABLE click_senders
    ADD COLUMN reply_to bytea,
    ADD COLUMN reply_uid bigint;
