// Reads Kafka record keys and values written with their Kafka Connect
// schema ({"schema": ..., "payload": ...}), one JSON document per line of
// standard input, and reads each with Kafka Connect's own JsonConverter
// (schemas.enable=true), as a sink connector would. Then writes the result
// back with the same converter and requires the original document: a
// payload that does not match its schema (a missing required field, a
// string where the schema says int32, bytes that are not base64, a decimal
// without its scale) either fails to convert or does not survive the round
// trip, and a schema that is not in the converter's own form differs.
//
// Prints "checked N" and exits 0, or prints the first document that failed
// and exits 1. Run with Kafka's jars on the class path:
//   tools/kafka-broker tool tools/kafka/ConnectJsonCheck.java < records
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;

public class ConnectJsonCheck {
  public static void main(String[] args) throws Exception {
    JsonConverter converter = new JsonConverter();
    converter.configure(Map.of("schemas.enable", "true"), false);
    ObjectMapper mapper = new ObjectMapper();
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    long n = 0;
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isEmpty()) {
        continue;
      }
      n++;
      JsonNode original = mapper.readTree(line);
      JsonNode back;
      try {
        SchemaAndValue read =
            converter.toConnectData("check", line.getBytes(StandardCharsets.UTF_8));
        if (read.schema() == null) {
          throw new IllegalStateException("the converter found no schema");
        }
        back = mapper.readTree(converter.fromConnectData("check", read.schema(), read.value()));
      } catch (Exception e) {
        System.out.println("document " + n + " does not convert: " + e);
        System.out.println(line);
        System.exit(1);
        return;
      }
      if (!back.equals(original)) {
        System.out.println("document " + n + " changes in a round trip through Kafka Connect");
        System.out.println("written:  " + line);
        System.out.println("read back: " + mapper.writeValueAsString(back));
        System.exit(1);
      }
    }
    System.out.println("checked " + n);
  }
}
