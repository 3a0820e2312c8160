/*
 * A YARN cluster for the tests: Hadoop's MiniYARNCluster (one ResourceManager, one NodeManager)
 * in this JVM, run from source by tests/yarn_cluster.py (`java -cp JARS MiniYarnClusterMain.java
 * CONFIG_OUT KEY=VALUE...`).
 *
 * hadoop-client-minicluster's own launcher, org.apache.hadoop.mapreduce.MiniHadoopClusterManager,
 * starts YARN only as a MapReduce cluster, whose classes (LocalContainerLauncher, the shuffle
 * handler) that jar leaves out: it fails with NoClassDefFoundError. Hence this one.
 *
 * Each KEY=VALUE is set on the cluster's configuration before it starts. Once the NodeManager
 * has registered, the configuration the cluster runs with (the ResourceManager's ports, drawn
 * free at start) is written to CONFIG_OUT, beside it first and renamed into place, so that a
 * reader never sees it half-written. Then the JVM runs until it is killed.
 */

import java.io.File;
import java.io.FileOutputStream;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

public class MiniYarnClusterMain {
  public static void main(String[] args) throws Exception {
    YarnConfiguration conf = new YarnConfiguration();
    for (int i = 1; i < args.length; i++) {
      String[] setting = args[i].split("=", 2);
      conf.set(setting[0], setting[1]);
    }
    // One NodeManager with one local and one log folder, under ./target/retrylib.
    MiniYARNCluster cluster = new MiniYARNCluster("retrylib", 1, 1, 1);
    cluster.init(conf);
    cluster.start();
    if (!cluster.waitForNodeManagersToConnect(60_000)) {
      throw new IllegalStateException("the NodeManager did not register in 60 s");
    }
    File written = new File(args[0] + ".tmp");
    try (FileOutputStream out = new FileOutputStream(written)) {
      cluster.getConfig().writeXml(out);
    }
    Files.move(written.toPath(), new File(args[0]).toPath(), StandardCopyOption.ATOMIC_MOVE);
    Thread.currentThread().join();
  }
}
