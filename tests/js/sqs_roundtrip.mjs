// The AWS SDK for JavaScript v3, unchanged, against Switchboard's SQS surface.
// Run by tests/sqs/test_js_sdk.py with SQS_ENDPOINT, AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY set; prints one JSON line of what it saw. The SDK
// checks MD5OfMessageBody on send and MD5OfBody on receive itself.
import {
  CreateQueueCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  SQSClient,
} from "@aws-sdk/client-sqs";

const client = new SQSClient({
  endpoint: process.env.SQS_ENDPOINT,
  region: process.env.AWS_REGION || "eu-central-1",
  maxAttempts: 1,
});

const attributes = {
  kind: { DataType: "String", StringValue: "résumé" },
  size: { DataType: "Number", StringValue: "12.5" },
  raw: { DataType: "Binary", BinaryValue: Uint8Array.from([0, 1, 2, 254, 255]) },
};

const { QueueUrl } = await client.send(new CreateQueueCommand({ QueueName: "js-jobs" }));
const sent = await client.send(
  new SendMessageCommand({
    QueueUrl,
    MessageBody: JSON.stringify({ hello: "wörld" }),
    MessageAttributes: attributes,
  }),
);
const batch = await client.send(
  new SendMessageBatchCommand({
    QueueUrl,
    Entries: [
      { Id: "a", MessageBody: "batch a" },
      { Id: "b", MessageBody: "batch b" },
    ],
  }),
);
const received = await client.send(
  new ReceiveMessageCommand({
    QueueUrl,
    MaxNumberOfMessages: 10,
    MessageAttributeNames: ["All"],
    MessageSystemAttributeNames: ["ApproximateReceiveCount"],
  }),
);
for (const message of received.Messages ?? []) {
  await client.send(new DeleteMessageCommand({ QueueUrl, ReceiptHandle: message.ReceiptHandle }));
}
const after = await client.send(
  new GetQueueAttributesCommand({ QueueUrl, AttributeNames: ["All"] }),
);
let missing = null;
try {
  await client.send(new ReceiveMessageCommand({ QueueUrl: QueueUrl + "-never" }));
} catch (error) {
  missing = { name: error.name, code: error.Code ?? null, status: error.$metadata?.httpStatusCode };
}

const first = (received.Messages ?? []).find((m) => m.MessageId === sent.MessageId);
console.log(
  JSON.stringify({
    queueUrl: QueueUrl,
    sentId: sent.MessageId,
    sentAttributesMd5: sent.MD5OfMessageAttributes,
    batchSuccessful: batch.Successful.map((e) => e.Id).sort(),
    receivedCount: (received.Messages ?? []).length,
    body: first?.Body,
    receivedAttributesMd5: first?.MD5OfMessageAttributes,
    attributes: first
      ? Object.fromEntries(
          Object.entries(first.MessageAttributes).map(([name, value]) => [
            name,
            { DataType: value.DataType, StringValue: value.StringValue, BinaryValue: value.BinaryValue ? Array.from(value.BinaryValue) : undefined },
          ]),
        )
      : null,
    receiveCount: first?.Attributes?.ApproximateReceiveCount,
    visibleAfter: after.Attributes.ApproximateNumberOfMessages,
    inFlightAfter: after.Attributes.ApproximateNumberOfMessagesNotVisible,
    missing,
  }),
);
