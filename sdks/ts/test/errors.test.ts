/** The error classes on their own: causes and the Retryable calling forms. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Metadata, status } from "@grpc/grpc-js";
import { CronoqError, Retryable } from "../src/index.js";
import { toCronoqError } from "../src/errors.js";

test("CronoqError keeps the error it was made from as cause", () => {
  const grpcError = Object.assign(new Error("14 UNAVAILABLE: no leader"), {
    code: status.UNAVAILABLE,
    details: "no leader",
    metadata: new Metadata(),
  });
  const err = toCronoqError(grpcError);
  assert.ok(err instanceof CronoqError);
  assert.equal(err.cause, grpcError);
  assert.equal(err.code, status.UNAVAILABLE);
  assert.equal(err.message, "cronoq: UNAVAILABLE: no leader");
  assert.ok(err.retryable);

  const plain = new RangeError("out of range");
  assert.equal(toCronoqError(plain).cause, plain);
  assert.equal(toCronoqError(plain).code, status.UNKNOWN);
  assert.equal(toCronoqError("thrown string").cause, "thrown string");
  assert.equal(toCronoqError(err), err, "a CronoqError passes unchanged");

  assert.equal(new CronoqError(status.INTERNAL, "x", { cause: plain }).cause, plain);
  assert.ok(!("cause" in new CronoqError(status.INTERNAL, "x")), "no cause unless given");
});

test("Retryable takes { retryAfter, cause } or, the earlier form, retryAfter positionally", () => {
  const cause = new Error("429 from upstream");
  const byOptions = new Retryable("rate limited", { retryAfter: 2.5, cause });
  assert.equal(byOptions.retryAfter, 2.5);
  assert.equal(byOptions.cause, cause);
  const positional = new Retryable("rate limited", 2.5, { cause });
  assert.equal(positional.retryAfter, 2.5);
  assert.equal(positional.cause, cause);
  assert.equal(new Retryable("soon").retryAfter, undefined);
  assert.equal(new Retryable("soon", { cause }).retryAfter, undefined);
  assert.equal(new Retryable("soon", undefined, { cause }).cause, cause);
  assert.equal(byOptions.name, "Retryable");
  assert.equal(byOptions.message, "rate limited");
});
