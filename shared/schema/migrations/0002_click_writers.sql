-- The last batch each collector process (writer) committed, numbered 1, 2, 3, ... per process.
-- A batch's transaction claims its number here first: a retry whose earlier attempt committed
-- after all (its COMMIT answer lost, or the COMMIT outliving a timeout) finds the number taken
-- and does not write the batch twice. Which seqs other collectors committed plays no part.
CREATE TABLE click_writers (
    writer     bigint PRIMARY KEY,
    last_batch bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
